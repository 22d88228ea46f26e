"""pinstage against the reference implementation, the `safetensors` package: files its
writers make (safetensors.torch, safetensors.numpy, huggingface_hub's sharded layout) load
byte-exact in pinstage (safe_open, load_file, the CLI, a device load on sim); files
pinstage writes load in safetensors with equal tensors and metadata; malformed files the
reference refuses are refused by pinstage too.

The peers come from requirements/peers.txt (scripts/venv.sh). Under Debian's interpreter
they are absent and this module is skipped; the venv pass of scripts/test.sh sets
PINSTAGE_REQUIRE_PEERS=1, and then a missing peer is an import error, not a skip."""
import gc
import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import struct
import subprocess

import pytest

REQUIRED = os.environ.get("PINSTAGE_REQUIRE_PEERS") == "1"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def peer(module):
    """`module`, imported; skipped when absent, except in the venv pass (an error there)."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)


st_torch = peer("safetensors.torch")
st_numpy = peer("safetensors.numpy")
safetensors = peer("safetensors")
import numpy as np  # noqa: E402 (after the skip: only the peers' numpy matters here)
import torch  # noqa: E402

import pinstage  # noqa: E402

# The dtypes torch 2.x and safetensors share, by safetensors name. U16/U32/U64 (torch 2.3+,
# few ops of their own) are tested apart: test_unsigned_16_to_64_bits_load_byte_exact.
DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64,
}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES["F8_E4M3"] = torch.float8_e4m3fn
    DTYPES["F8_E5M2"] = torch.float8_e5m2
UNSIGNED_WIDE = {n: getattr(torch, a) for n, a in
                 (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")) if hasattr(torch, a)}


def raw(t):
    """A tensor's bytes in row-major order, as a file holds them."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    if not t.numel():
        return b""
    # A fresh 1-D copy: a view with a size-1 dim may keep a stride other than 1.
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def same(got, want):
    return got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape) and \
        raw(got) == raw(want)


def every_dtype(seed=26):
    """One tensor or more per dtype, with the values that tell a wrong read: each dtype's
    extremes, -0, inf and NaN, every float8 bit pattern; and a 0-d and an empty tensor."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, dtype in DTYPES.items():
        if dtype == torch.bool:
            t = torch.rand(5, 3, generator=g) > 0.5
        elif dtype.is_floating_point and dtype.itemsize == 1:  # float8: all 256 patterns
            t = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
        elif dtype.is_floating_point:
            info = torch.finfo(dtype)
            edge = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"),
                                 info.max, info.min, info.tiny], dtype=torch.float64)
            t = torch.cat([edge.to(dtype), torch.randn(37, generator=g).to(dtype)]).reshape(5, 9)
        else:
            info = torch.iinfo(dtype)
            t = torch.tensor([info.min, info.max, 0, -1 if info.min else 1], dtype=dtype)
            t = torch.cat([t, torch.randint(0, 100, (7,), generator=g, dtype=dtype)]).reshape(11, 1)
        out[f"t.{name.lower()}"] = t
    out["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    out["empty"] = torch.zeros(0, 3, dtype=torch.float16)
    return out


def cli_ok(cli, *args):
    done = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def test_the_venv_pass_runs_the_pinned_versions():
    """The venv pass must test what requirements/peers.txt names: torch 2.x, NumPy 2.x and
    every peer at its pin (a stale or foreign venv would pass vacuously otherwise)."""
    if not REQUIRED:
        pytest.skip("not the venv pass (PINSTAGE_REQUIRE_PEERS=1)")
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements/peers.txt")
                           .read_text(), re.M))
    for name in ("torch", "numpy", "safetensors", "fastsafetensors", "runai-model-streamer",
                 "huggingface_hub", "hypothesis", "pytest"):
        assert importlib.metadata.version(name).split("+")[0] == pins[name], name
    assert int(torch.__version__.split(".")[0]) >= 2 and int(np.__version__.split(".")[0]) >= 2
    assert "F8_E4M3" in DTYPES


def test_save_file_loads_byte_exact_in_safe_open_and_load_file(worker, tmp_path):
    ref = every_dtype()
    meta = {"format": "pt", "note": "written by safetensors.torch", "ünï": "çødé"}
    path = tmp_path / "m.safetensors"
    st_torch.save_file(ref, path, metadata=meta)
    with pinstage.safe_open(path, framework="pt", worker=worker) as f:
        assert sorted(f.keys()) == sorted(ref)
        assert f.metadata() == meta
        for name, want in ref.items():
            got = f.get_tensor(name)
            assert same(got, want), name
            assert pinstage.is_pinned(got), name
        # A slice reads the rows and columns torch's indexing gives.
        part = f.get_slice("t.f32")[1:4, ::2]
        assert same(part, ref["t.f32"][1:4, ::2])
    got = pinstage.load_file(path, worker=worker, threads=3, chunk_bytes=7)
    assert sorted(got) == sorted(ref)
    for name, want in ref.items():
        assert same(got[name], want), name
    if "F8_E4M3" in DTYPES:  # torch 2.x: float8 comes back as float8, not its bytes
        assert got["t.f8_e4m3"].dtype == torch.float8_e4m3fn
        assert got["t.f8_e5m2"].dtype == torch.float8_e5m2
    # And safetensors itself agrees with what it wrote (the test's own ground truth).
    back = st_torch.load_file(path)
    assert all(same(back[n], ref[n]) for n in ref)


def test_save_file_loads_byte_exact_on_the_sim_device(worker, tmp_path):
    ref = every_dtype(seed=3)
    path = tmp_path / "m.safetensors"
    st_torch.save_file(ref, path)
    dev = pinstage.load_to_device(path, worker=worker, ring_bytes=1 << 20)
    assert sorted(dev.keys()) == sorted(ref)
    for name, want in ref.items():
        assert dev.to_bytes(name) == raw(want), name
    dev.close()


def test_the_cli_reads_save_file_byte_exact(tmp_path, cli):
    """`pinstage hash` hashes every tensor as the CLI reads it: each hash is that of the
    bytes safetensors wrote; `load --verify` then checks every tensor on the host and, read
    back, on the sim device."""
    ref = every_dtype(seed=5)
    path = tmp_path / "m.safetensors"
    st_torch.save_file(ref, path)
    cli_ok(cli, "hash", path, "--quiet")
    sidecar = json.loads((tmp_path / "m.safetensors.pinstage.xxh3.json").read_text())
    assert set(sidecar["tensors"]) == set(ref)
    for name, want in ref.items():
        assert sidecar["tensors"][name]["xxh3"] == f"{pinstage.xxh3_64(raw(want)):016x}", name
    for to in ("host", "device"):
        report = json.loads(cli_ok(cli, "load", path, "--to", to, "--verify", "--json", "-",
                                   "--quiet").stdout)
        assert report["run"]["pinstage_version"] == pinstage.__version__


def test_numpy_save_file_loads_byte_exact(worker, tmp_path):
    rng = np.random.default_rng(8)
    ref = {
        "bool": rng.random((4, 3)) > 0.5, "u8": np.arange(256, dtype=np.uint8),
        "i8": np.array([-128, 127, 0], dtype=np.int8),
        "i16": np.array([-2**15, 2**15 - 1], dtype=np.int16),
        "i32": rng.integers(-2**31, 2**31, (3, 3), dtype=np.int32),
        "i64": np.array([-2**63, 2**63 - 1, 7], dtype=np.int64),
        "f16": np.array([np.inf, -0.0, 65504, 6e-8], dtype=np.float16),
        "f32": rng.standard_normal((2, 5, 3), dtype=np.float32),
        "f64": np.array([np.nan, 1e308, -5e-324]), "scalar": np.array(1.25, dtype=np.float32),
    }
    path = tmp_path / "n.safetensors"
    st_numpy.save_file(ref, str(path), metadata={"writer": "numpy"})
    with pinstage.safe_open(path, framework="numpy", worker=worker) as f:
        assert f.metadata() == {"writer": "numpy"}
        for name, want in ref.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert raw(got) == raw(want), name
            del got
    for name, got in pinstage.load_file(path, worker=worker).items():
        assert raw(got) == raw(ref[name]), name
    # NumPy 2 through DLPack: np.from_dlpack takes the same pinned tensors zero-copy.
    got = pinstage.load_file(path, worker=worker, names=["f32"])["f32"]
    view = np.from_dlpack(got)
    assert view.ctypes.data == got.data_ptr() and raw(view) == raw(ref["f32"])


@pytest.mark.skipif(not UNSIGNED_WIDE, reason="this torch has no uint16/uint32/uint64")
def test_unsigned_16_to_64_bits_load_byte_exact(worker, tmp_path):
    ref = {n.lower(): torch.tensor([0, 1, 2**(8 * t.itemsize - 1) - 1, 5], dtype=torch.int64)
           .to(t).reshape(2, 2) for n, t in UNSIGNED_WIDE.items()}
    ref["u64.top"] = torch.tensor([2**63 - 1], dtype=torch.int64).view(torch.uint64)
    ref["u64.top"] = torch.cat([ref["u64.top"], torch.tensor([-1], dtype=torch.int64)
                                .view(torch.uint64)])  # 2**64 - 1: the top bit set
    path = tmp_path / "u.safetensors"
    st_torch.save_file(ref, path)
    got = pinstage.load_file(path, worker=worker)
    for name, want in ref.items():
        assert same(got[name], want), name
    with pinstage.safe_open(path, framework="numpy", worker=worker) as f:
        assert f.get_tensor("u16").dtype == np.uint16
        assert f.get_tensor("u64.top").tolist() == [2**63 - 1, 2**64 - 1]
    dev = pinstage.load_to_device(path, worker=worker)
    assert all(dev.to_bytes(n) == raw(t) for n, t in ref.items())
    dev.close()


def test_an_empty_metadata_key_reads_as_the_reference_reads_it(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    st_torch.save_file({"x": torch.ones(2)}, path, metadata={"": "v"})
    with safetensors.safe_open(path, framework="pt") as f:
        assert f.metadata() == {"": "v"}
    with pinstage.safe_open(path, worker=worker) as f:
        assert f.metadata() == {"": "v"}


def test_an_empty_tensor_name_is_refused_though_the_reference_reads_it(worker, tmp_path):
    """A deliberate difference (safetensors.h: a tensor name is never empty, as TaskArgs
    names are not): the reference writes and reads it, pinstage says what is wrong."""
    path = tmp_path / "e.safetensors"
    st_torch.save_file({"": torch.ones(2)}, path)
    assert list(st_torch.load_file(path)) == [""]
    with pytest.raises(pinstage.Error, match="a tensor has an empty name"):
        pinstage.safe_open(path, worker=worker)


def test_huggingface_hub_sharded_directory_loads_byte_exact(worker, tmp_path, cli):
    hub = peer("huggingface_hub")
    ref = {f"layers.{i}.{k}": v for i in range(3) for k, v in every_dtype(seed=i).items()}
    g = torch.Generator().manual_seed(1)
    ref.update({f"layers.{i}.w": torch.randn(64, 128, generator=g) for i in range(3)})
    out = tmp_path / "model"
    out.mkdir()
    hub.save_torch_state_dict(ref, out, max_shard_size="40KB")  # 32 KB weights: a shard each
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 3 and set(index["weight_map"]) == set(ref)
    got = pinstage.load_file(out, worker=worker)
    assert sorted(got) == sorted(ref)
    for name, want in ref.items():
        assert same(got[name], want), name
    del got
    dev = pinstage.load_to_device(out, worker=worker)
    for name, want in ref.items():
        assert dev.to_bytes(name) == raw(want), name
    dev.close()
    cli_ok(cli, "hash", out, "--quiet")
    cli_ok(cli, "load", out, "--verify", "--quiet")


@pytest.fixture(scope="module")
def pinstage_written(tmp_path_factory, cli):
    """Checkpoints pinstage's writer made: one file and a sharded directory (the fixture
    CLI, save_safetensors and save_sharded_checkpoint behind it)."""
    d = tmp_path_factory.mktemp("pinstage-written")
    base = [str(cli), "fixture", "qwen3-decode", "--layers", "1", "--seq-len", "64", "--quiet"]
    subprocess.run(base + ["--out", str(d / "one.safetensors")], check=True, capture_output=True)
    subprocess.run(base + ["--out", str(d / "sharded"), "--shard-size", "128M"], check=True,
                   capture_output=True)
    return d


def test_pinstage_written_file_loads_in_safetensors(worker, pinstage_written):
    path = pinstage_written / "one.safetensors"
    theirs = st_torch.load_file(path)
    ours = pinstage.load_file(path, worker=worker, verify=True)
    assert sorted(theirs) == sorted(ours)
    for name in ours:
        assert same(theirs[name], ours[name]), name
    with safetensors.safe_open(path, framework="pt") as f, \
            pinstage.safe_open(path, worker=worker) as g:
        meta = f.metadata()
        assert meta == g.metadata()  # the metadata round-trips, pinstage's own keys included
        assert {k for k in meta if k.startswith("pinstage.xxh3.")} == \
            {f"pinstage.xxh3.{n}" for n in ours}
        assert f.get_slice("wq").get_shape() == g.get_slice("wq").get_shape()
        assert f.get_slice("wq").get_dtype() == g.get_slice("wq").get_dtype() == "BF16"


def test_pinstage_sharded_directory_loads_shard_by_shard_in_safetensors(worker,
                                                                        pinstage_written):
    d = pinstage_written / "sharded"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    ours = pinstage.load_file(d, worker=worker, verify=True)
    theirs = {}
    for s in shards:  # what transformers does with the index
        part = st_torch.load_file(d / s)
        assert all(index["weight_map"][n] == s for n in part)
        theirs.update(part)
    assert sorted(theirs) == sorted(ours)
    for name in ours:
        assert same(theirs[name], ours[name]), name


def test_save_golden_file_loads_in_safetensors(worker, tmp_path):
    """pinstage's writer through Python: run_scene(save_golden=) writes a .safetensors."""
    path = tmp_path / "golden.safetensors"
    pinstage.run_scene(worker, "qwen3-decode", {"layers": 1, "seq_len": 64},
                       save_golden=str(path))
    theirs = st_torch.load_file(path)
    with pinstage.safe_open(path, worker=worker) as f:
        assert sorted(f.keys()) == sorted(theirs)
        for name in f.keys():
            assert same(f.get_tensor(name), theirs[name]), name
    gc.collect()


# Malformed files. Each starts from a valid file safetensors wrote (tensors "a" F32 [4] and
# "b" I64 [2]) and breaks one thing. REFERENCE_REFUSES records what safetensors 0.8 does,
# checked below, so an upgrade that changes it is seen; pinstage refuses every one.
def _valid():
    return st_torch.save({"a": torch.arange(4, dtype=torch.float32),
                          "b": torch.tensor([5, -6], dtype=torch.int64)})


def _split(blob):
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _join(header, data, text=None):
    text = text if text is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _edit(fn):
    def make():
        header, data = _split(_valid())
        fn(header)
        return _join(header, data)
    return make


def _offsets(name, begin, end):
    def fn(h):
        h[name]["data_offsets"] = [begin, end]
    return fn


def _set(name, key, value):
    def fn(h):
        h[name][key] = value
    return fn


def _duplicate_key():
    header, data = _split(_valid())
    text = json.dumps(header)
    a = json.dumps({"a": header["a"]})[1:-1]
    return _join(None, data, (text[:-1] + ", " + a + "}").encode())


MALFORMED = {
    "shorter than the length prefix": lambda: _valid()[:5],
    "header length past the file": lambda: struct.pack("<Q", len(_valid())) + _valid()[8:],
    "truncated header": lambda: _valid()[:8 + struct.unpack("<Q", _valid()[:8])[0] // 2],
    "truncated data": lambda: _valid()[:-3],
    "trailing bytes after the data": lambda: _valid() + b"\0" * 8,
    "overlapping offsets": _edit(lambda h: (_offsets("a", 0, 16)(h), _offsets("b", 8, 24)(h))),
    "offsets out of range": _edit(_offsets("b", 16, 40)),
    "a hole between tensors": _edit(lambda h: (_offsets("a", 0, 16)(h), _offsets("b", 24, 40)(h))),
    "end before begin": _edit(_offsets("b", 32, 16)),
    "unknown dtype": _edit(_set("a", "dtype", "F33")),
    "lower-case dtype": _edit(_set("a", "dtype", "f32")),
    "shape that disagrees with the bytes": _edit(_set("a", "shape", [5])),
    "negative dimension": _edit(_set("a", "shape", [-4])),
    "header that is not JSON": lambda: _join(None, _split(_valid())[1], b"{not json" + b" " * 7),
    "header that is a JSON list": lambda: _join(None, b"", b"[]      "),
    "metadata value not a string": _edit(lambda h: h.__setitem__("__metadata__", {"k": 1})),
    "duplicate tensor name": _duplicate_key,
}
# What safetensors 0.8 does with each (True: refuses). A repeated tensor name it reads as
# the last entry (serde's map, later wins); pinstage refuses it (safetensors.h), since which
# of two entries a reader keeps is the reader's choice, not the file's.
REFERENCE_REFUSES = {name: name != "duplicate tensor name" for name in MALFORMED}


def _reference_refuses(blob):
    try:
        st_torch.load(blob)
    except Exception:  # safetensors raises SafetensorError, or ValueError / RuntimeError
        return True
    return False


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_are_refused_like_the_reference(worker, tmp_path, cli, case):
    blob = MALFORMED[case]()
    assert _reference_refuses(blob) == REFERENCE_REFUSES[case], \
        f"safetensors {safetensors.__version__} changed its mind about: {case}"
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(pinstage.Error):
        pinstage.safe_open(path, worker=worker)
    with pytest.raises(pinstage.Error):
        pinstage.load_file(path, worker=worker)
    done = subprocess.run([str(cli), "load", str(path), "--quiet"], capture_output=True,
                          text=True)
    assert done.returncode != 0 and "bad.safetensors" in done.stderr, done.stderr
    assert worker.stats().pinned_count == 0  # refused before any memory was taken


def test_the_valid_file_behind_the_malformed_cases_loads(worker, tmp_path):
    """The cases above fail for their one defect: the file they start from is fine."""
    path = tmp_path / "ok.safetensors"
    path.write_bytes(_valid())
    got = pinstage.load_file(path, worker=worker)
    assert got["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and got["b"].tolist() == [5, -6]
