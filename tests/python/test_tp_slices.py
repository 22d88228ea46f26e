"""Tensor-parallel slices from Python (issue 24's "Slices" and "Read once"): a sharded
Hugging Face style checkpoint (model-0000k-of-0000n.safetensors + model.safetensors.index.json)
of every dtype pinstage reads, written here by hand with NumPy (no pinstage), loaded for
tp 1, 2, 4 and 8 through pinstage.load_tp (every rank, every tensor) and through
safe_open(...).get_slice (each rank's part), byte-exact against numpy.array_split of the
NumPy reference; the bytes read are counted: a load reads exactly the checkpoint once, all
ranks together, and a slice exactly its own bytes. Refusals name what is at fault and
leave nothing allocated."""
import ctypes
import gc
import json
import struct

import numpy as np
import pytest
import torch

import pinstage

# name: (safetensors dtype, NumPy dtype of its raw values, shape, split dim or None).
# Split dims are even and uneven for tp 2, 4 and 8 and never below 8.
TENSORS = {
    "model.layers.0.self_attn.q_proj.weight": ("F32", np.float32, (16, 12), 0),
    "model.layers.0.self_attn.o_proj.weight": ("BF16", np.uint16, (12, 13), 1),
    "model.layers.0.mlp.gate_proj.weight": ("F16", np.float16, (11, 8), 0),
    "model.layers.0.mlp.down_proj.weight": ("I8", np.int8, (5, 24), 1),
    "model.layers.0.input_layernorm.weight": ("F32", np.float32, (12,), None),
    "model.embed_tokens.weight": ("I32", np.int32, (19, 4), 0),
    "lm_head.weight": ("F64", np.float64, (9, 6), 0),
    "model.layers.1.attn.cube": ("I64", np.int64, (3, 2, 10), -1),
    "model.layers.1.flags": ("BOOL", np.bool_, (4, 8), 1),
    "model.layers.1.bytes": ("U8", np.uint8, (2, 3, 17), 2),
    "model.layers.1.i16": ("I16", np.int16, (10, 3), 0),
    "model.layers.1.f8_e4m3": ("F8_E4M3", np.uint8, (8, 9), 1),
    "model.layers.1.f8_e5m2": ("F8_E5M2", np.uint8, (16,), 0),
    "model.norm.scale": ("F32", np.float32, (), None),
}
PLAN = {"format": "pinstage.tp_plan/1",
        "rules": [{"match": "*.layernorm.*", "replicate": True},
                  {"match": "model.norm.*", "replicate": True}]
        + [{"match": n, "split": d} for n, (_, _, _, d) in TENSORS.items() if d is not None],
        "default": {"replicate": True}}


def reference():
    """{name: NumPy array} of deterministic values (floats exact in their type)."""
    rng = np.random.default_rng(24)
    out = {}
    for name, (_, np_dtype, shape, _) in TENSORS.items():
        if np_dtype == np.bool_:
            out[name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(np_dtype, np.floating):
            out[name] = (rng.integers(-512, 512, size=shape) / 8).astype(np_dtype)
        else:
            info = np.iinfo(np_dtype)
            out[name] = rng.integers(info.min, info.max, size=shape, dtype=np_dtype,
                                     endpoint=True)
    return out


def write_shard(path, arrays):
    header, data = {}, b""
    for name, a in arrays.items():
        raw = a.tobytes()
        header[name] = {"dtype": TENSORS[name][0], "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(directory, reference arrays): three shards and the index."""
    d = tmp_path_factory.mktemp("tp") / "model"
    d.mkdir()
    ref = reference()
    names = list(TENSORS)
    parts = [names[:5], names[5:9], names[9:]]
    weight_map = {}
    for k, part in enumerate(parts, 1):
        shard = f"model-{k:05d}-of-{len(parts):05d}.safetensors"
        write_shard(d / shard, {n: ref[n] for n in part})
        weight_map.update({n: shard for n in part})
    total = sum(a.nbytes for a in ref.values())
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return d, ref


def tensor_bytes(t):
    """The bytes of a contiguous torch tensor or NumPy array."""
    if isinstance(t, np.ndarray):
        return t.tobytes()
    assert t.is_contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def part(a, dim, tp, rank):
    """numpy.array_split's part: the reference for rank `rank`."""
    return np.ascontiguousarray(np.array_split(a, tp, axis=dim)[rank])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_load_tp_slices_are_numpy_array_split_and_read_once(worker, model, tp):
    d, ref = model
    load = pinstage.load_tp(d, tp, PLAN, worker=worker)
    assert load.tp == tp and len(load.ranks) == tp
    r = load.report
    total = sum(a.nbytes for a in ref.values())
    assert r["read_bytes"] == r["checkpoint_bytes"] == total, "every byte read once"
    replicated = sum(ref[n].nbytes for n, spec in TENSORS.items() if spec[3] is None)
    own = sum(x["direct_bytes"] + x["scatter_bytes"] for x in r["ranks"])
    assert own + replicated == total, "all ranks together: the checkpoint, once"
    assert r["host_bytes"] == total
    for rank in range(tp):
        tensors = load.ranks[rank]
        assert list(tensors) == pinstage.safe_open(d, worker=worker).keys()
        for s in load.slices[rank]:
            name = s["name"]
            dtype, _, shape, dim = TENSORS[name]
            t = tensors[name]
            if dim is None:
                want = ref[name]
                assert s["shared"] and t.data_ptr() == load.ranks[0][name].data_ptr()
            else:
                want = part(ref[name], dim, tp, rank)
                begin, count = pinstage.tp_part(shape[dim], tp, rank)
                assert (s["dim"], s["begin"]) == (dim % len(shape), begin)
                assert want.shape[dim] == count
            assert tuple(t.shape) == want.shape, name
            assert tensor_bytes(t) == want.tobytes(), f"{name} rank {rank}"
            assert s["bytes"] == want.nbytes and s["dtype"] == dtype
            assert pinstage.is_pinned(t) or t.numel() == 0


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_get_slice_reads_only_each_ranks_part(worker, model, tp):
    d, ref = model
    with pinstage.safe_open(d, worker=worker) as f:
        for name, (dtype, _, shape, dim) in TENSORS.items():
            sl = f.get_slice(name)
            assert sl.get_shape() == list(shape) and sl.get_dtype() == dtype
            if dim is None:
                continue
            for rank in range(tp):
                begin, count = pinstage.tp_part(shape[dim], tp, rank)
                index = [slice(None)] * len(shape)
                index[dim] = slice(begin, begin + count)
                before, whole_before = sl.read_bytes, f.read_bytes
                t = sl[tuple(index)]
                want = part(ref[name], dim, tp, rank)
                assert tensor_bytes(t) == want.tobytes(), f"{name} rank {rank}"
                assert tuple(t.shape) == want.shape
                # Rows: one range of the file; columns: one range per row. Either way
                # exactly the slice's bytes are asked of the file, none around them.
                assert sl.read_bytes - before == want.nbytes
                assert f.read_bytes - whole_before == want.nbytes


INDEXES = [..., 3, -1, (slice(None), 2), (1, slice(2, None, 3)), (..., 0), slice(100, 200),
           slice(-3, None), (slice(1, 8, 2), slice(None, None, 4)), (), (slice(None),) * 2,
           (2, -4), (slice(5, 2),)]


@pytest.mark.parametrize("framework", ["pt", "numpy"])
def test_get_slice_indexes_as_numpy_does(worker, model, framework):
    d, ref = model
    a = ref["model.layers.0.self_attn.q_proj.weight"]  # [16, 12] F32
    with pinstage.safe_open(d, framework=framework, worker=worker) as f:
        sl = f.get_slice("model.layers.0.self_attn.q_proj.weight")
        for index in INDEXES:
            want = np.array(a[index])  # 0-d stays 0-d
            before = f.read_bytes
            got = sl[index]
            assert isinstance(got, np.ndarray if framework == "numpy" else torch.Tensor)
            assert tuple(got.shape) == want.shape, index
            assert tensor_bytes(got) == want.tobytes(), index
            assert f.read_bytes - before == want.nbytes, index
        cube = f.get_slice("model.layers.1.attn.cube")[1, :, 3:7]  # a 3-D block
        assert tensor_bytes(cube) == np.ascontiguousarray(ref["model.layers.1.attn.cube"][1, :, 3:7]).tobytes()
        scalar = f.get_slice("model.norm.scale")[()]
        assert tensor_bytes(scalar) == ref["model.norm.scale"].tobytes()
        whole = f.get_tensor("model.layers.1.flags")
        assert tensor_bytes(whole) == ref["model.layers.1.flags"].tobytes()


def test_numpy_framework_gives_arrays_of_the_right_dtype(worker, model):
    d, ref = model
    with pinstage.safe_open(d, framework="np", worker=worker) as f:
        for name in ["model.layers.1.i16", "model.layers.1.flags", "lm_head.weight"]:
            got = f.get_slice(name)[1:]
            assert got.dtype == ref[name].dtype and np.array_equal(got, ref[name][1:])
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            with pytest.raises(pinstage.InvalidArgumentError,
                               match="is BF16, which NumPy has no dtype for"):
                f.get_slice("model.layers.0.self_attn.o_proj.weight")
            with pytest.raises(pinstage.InvalidArgumentError,
                               match="is BF16, which NumPy has no dtype for"):
                pinstage.load_tp(d, 2, PLAN, worker=worker, framework="numpy")
    del got  # the last array held its buffer
    gc.collect()
    assert worker.stats().pinned_count == 0


def test_bad_slices_are_refused_by_name(worker, model):
    d, _ = model
    name = "model.layers.0.self_attn.q_proj.weight"
    with pinstage.safe_open(d, worker=worker) as f:
        sl = f.get_slice(name)
        bad = [
            ((slice(None, None, -1),), ValueError, "dim 0: the step must be >= 1"),
            ((slice(None, None, 0),), ValueError, "slice step cannot be zero"),
            ((0, 0, 0), IndexError, "too many indices for a tensor of dimension 2 .3 given."),
            ((..., ...), IndexError, "a single ellipsis"),
            ((16,), IndexError, "index 16 is out of bounds for dim 0 with size 16"),
            ((0, -13), IndexError, "index -13 is out of bounds for dim 1 with size 12"),
            (([0, 1],), TypeError, "an index is an int, a slice or '...' .one per dim., not list"),
            ((None,), TypeError, "not NoneType"),
            ((True,), TypeError, "not bool"),
        ]
        for index, error, message in bad:
            with pytest.raises(error, match=message):
                sl[index]
        with pytest.raises(pinstage.Error, match="no tensor 'nope'"):
            f.get_slice("nope")
        assert f.read_bytes == 0
    with pytest.raises(pinstage.InvalidArgumentError,
                       match="verify=True cannot check a slice of tensor"):
        pinstage.safe_open(d, worker=worker, verify=True).get_slice(name)
    with pytest.raises(pinstage.InvalidArgumentError, match="framework must be 'pt'"):
        pinstage.safe_open(d, framework="tf", worker=worker)
    gc.collect()
    assert worker.stats().pinned_count == 0


def test_impossible_splits_and_bad_plans_are_refused_before_any_memory(worker, model):
    d, _ = model
    refusals = [
        (10, PLAN, "tp load: tensor 'lm_head.weight' (shape [9, 6]): rule 8 (match "
         "'lm_head.weight': split dim 0) would split dim 0 of size 9 into 10 parts: 1 would "
         "be empty (replicate it, or split a dim of at least tp); nothing was loaded"),
        (2, {**PLAN, "rules": [{"match": "lm_head.weight", "split": 2}]},
         "tp load: tensor 'lm_head.weight' (shape [9, 6]): rule 1 (match 'lm_head.weight': "
         "split dim 2) cannot split it: it has 2 dims (0..1, or -2..-1); nothing was loaded"),
        (2, {**PLAN, "tp": 4}, "tp load: the plan was written for tp 4, not 2"),
        (2, {**PLAN, "rulez": []},
         "tp plan 'load_tp(): plan': the plan has an unknown key 'rulez'"),
        (0, PLAN, "tp load: tp is 0; it must be a whole number in [1, 1024]"),
    ]
    for tp, plan, message in refusals:
        with pytest.raises(pinstage.InvalidArgumentError) as e:
            pinstage.load_tp(d, tp, plan, worker=worker)
        assert str(e.value) == message
    with pytest.raises(TypeError, match="plan must be a TpPlan, a dict"):
        pinstage.load_tp(d, 2, 3, worker=worker)
    with pytest.raises(TypeError, match="needs worker=pinstage.Worker"):
        pinstage.load_tp(d, 2, PLAN, worker=None)
    assert worker.stats().pinned_count == 0


def test_a_stopped_load_leaves_nothing_and_the_views_keep_the_memory(worker, model):
    d, ref = model

    def stop(done, total):
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt, match="stop"):
        pinstage.load_tp(d, 4, PLAN, worker=worker, chunk_bytes=64, progress=stop)
    assert worker.stats().pinned_count == 0
    plan = pinstage.TpPlan().split("*.q_proj.weight", 0).split("*.o_proj.weight", 1)
    load = pinstage.load_tp(d, 2, plan, worker=worker, verify="if-present")
    q = load.ranks[1]["model.layers.0.self_attn.q_proj.weight"]
    assert load.report["load"]["unverified"] == len(TENSORS)  # hand-written: no hashes
    del load
    gc.collect()
    assert worker.stats().pinned_count > 0  # q keeps its buffer
    assert tensor_bytes(q) == part(ref["model.layers.0.self_attn.q_proj.weight"], 0, 2, 1).tobytes()
    del q
    gc.collect()
    assert worker.stats().pinned_count == 0
