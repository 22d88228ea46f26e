"""Safetensors files for the tests: write_safetensors (one file of raw tensors, also
test_py_doc_examples.py's), write_shard (one of numpy arrays, also test_tp_load_cli.py's)
and the checkpoint the torch.distributed tests load (test_distributed.py writes it,
distributed_rank.py checks each rank's slices against it): several dtypes in 5 files, so
that 2 and 4 ranks split the files unevenly, with row, column, 3-D and uneven splits, a
replicated tensor and the default."""
import json
import struct

import numpy as np

DTYPES = {"float32": "F32", "float16": "F16", "int64": "I64", "int8": "I8"}
PLAN = {"format": "pinstage.tp_plan/1",
        "rules": [{"match": "*.q_proj.weight", "split": 0},
                  {"regex": r"layers\.\d+\.o_proj\.weight", "split": 1},
                  {"match": "*.cube", "split": -1},
                  {"match": "*norm*", "replicate": True}],
        "default": {"split": 0}}


def arrays():
    """{name: (array, split dim or None)}, the same in every process (seeded)."""
    rng = np.random.default_rng(27)
    out = {}
    for layer in range(4):
        p = f"layers.{layer}."
        out[p + "q_proj.weight"] = (rng.standard_normal((256, 384), dtype=np.float32), 0)
        out[p + "o_proj.weight"] = (rng.standard_normal((192, 257)).astype(np.float16), 1)
        out[p + "cube"] = (rng.integers(-2**40, 2**40, (3, 4, 257), dtype=np.int64), -1)
        out[p + "norm.weight"] = (rng.standard_normal(384, dtype=np.float32), None)
    out["embed.weight"] = (rng.integers(-128, 127, (1001, 96), dtype=np.int8), 0)
    return out


def write_safetensors(path, tensors):
    """A minimal safetensors file: {name: (dtype, shape, bytes)}."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def write_shard(path, arrays):
    """A safetensors file of numpy arrays: {name: array}."""
    write_safetensors(path, {n: (DTYPES[a.dtype.name], list(a.shape), a.tobytes())
                             for n, a in arrays.items()})


def write_checkpoint(directory):
    """The checkpoint in `directory` (5 shards and an index) and the plan beside it;
    returns (checkpoint dir, plan path)."""
    d = directory / "model"
    d.mkdir()
    all_arrays = arrays()
    names = list(all_arrays)
    shards = {f"model-{i + 1:05d}-of-00005.safetensors": names[i::5] for i in range(5)}
    for shard, part in shards.items():
        write_shard(d / shard, {n: all_arrays[n][0] for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: s for s, part in shards.items() for n in part}}))
    plan = directory / "plan.json"
    plan.write_text(json.dumps(PLAN))
    return d, plan


def expected_slice(name, tp, rank):
    """Rank `rank`'s slice of tensor `name` as numpy cuts it (numpy.array_split)."""
    a, dim = arrays()[name]
    if dim is None:
        return a
    return np.ascontiguousarray(np.array_split(a, tp, axis=dim % a.ndim)[rank])


# A small checkpoint for the CLI tests (test_tp_load_cli.py, test_cli_devices.py): row,
# column, last-dim and uneven splits, a replicated tensor; name: (array, split dim or None).
SMALL = {
    "layers.0.q_proj.weight": (np.arange(12 * 6, dtype=np.float32).reshape(12, 6), 0),
    "layers.0.o_proj.weight": (np.arange(6 * 13, dtype=np.float16).reshape(6, 13), 1),
    "layers.0.cube": (np.arange(3 * 4 * 9, dtype=np.int64).reshape(3, 4, 9), -1),
    "layers.0.norm.weight": (np.ones(6, dtype=np.float32), None),
    "embed.weight": (np.arange(17 * 3, dtype=np.int8).reshape(17, 3), 0),
}


def write_small_checkpoint(tmp_path):
    """SMALL in tmp_path/model (2 shards and an index) and PLAN in tmp_path/plan.json;
    returns (checkpoint dir, plan path)."""
    d = tmp_path / "model"
    d.mkdir()
    names = list(SMALL)
    shards = {"model-00001-of-00002.safetensors": names[:3],
              "model-00002-of-00002.safetensors": names[3:]}
    for shard, part in shards.items():
        write_shard(d / shard, {n: SMALL[n][0] for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: s for s, part in shards.items() for n in part}}))
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    return d, tmp_path / "plan.json"
