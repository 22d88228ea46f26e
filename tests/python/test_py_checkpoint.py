"""safe_open / load_file / load_to_device against a hand-written reference parser of the
safetensors format (below: 20 lines from the spec, sharing no code with pinstage), and the
lifetime rules of the tensors they return (the PinnedTorchAllocator's)."""
import gc
import json
import re
import struct

import pytest
import torch

import pinstage

_REF_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64,
    # No float8 in Debian's torch: the raw bytes, as pinstage documents.
    "F8_E4M3": getattr(torch, "float8_e4m3fn", torch.uint8),
    "F8_E5M2": getattr(torch, "float8_e5m2", torch.uint8),
}


def reference_parse(path):
    """{name: tensor} and the __metadata__ of a .safetensors file, straight from the spec:
    u64 little-endian header length, JSON header, data section."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        buf = bytearray(data[b:end]) or bytearray(1)
        t = torch.frombuffer(buf, dtype=torch.uint8)[:end - b]
        out[name] = t.view(_REF_DTYPES[e["dtype"]]).reshape(e["shape"])
    return out, meta


def write_file(path, tensors, metadata=None):
    """A .safetensors file written by hand (no pinstage), tensors as {name: torch tensor}
    or {name: (torch tensor, safetensors dtype)}."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t, dtype = t if isinstance(t, tuple) else (
            t, next(k for k, v in _REF_DTYPES.items() if v == t.dtype))
        b = raw(t)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def small_checkpoint(path, seed, **extra):
    """A three-tensor .safetensors file (bf16, f32 and i64; `extra` tensors after them),
    written by write_file from `seed`: the map-mode and cache tests' checkpoint."""
    g = torch.Generator().manual_seed(seed)
    write_file(path, {"a": torch.randn(300, 70, generator=g).bfloat16(),
                      "b": torch.randn(1000, generator=g),
                      "c": torch.arange(17, dtype=torch.int64), **extra})
    return path


def raw(t):
    """The bytes of a tensor, as the file holds them."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def sample():
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "b": torch.randn(5, generator=g, dtype=torch.float64),
        "h": torch.randn(3, 3, generator=g).half(),
        "f": torch.randn(17, generator=g),
        "ids": torch.randint(-9, 9, (11,), generator=g),
        "i32": torch.randint(-9, 9, (2, 3), generator=g, dtype=torch.int32),
        "i16": torch.randint(-9, 9, (3,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-9, 9, (5,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (9,), generator=g, dtype=torch.uint8),
        "mask": torch.rand(4, generator=g) > 0.5,
        "e4m3": (torch.randint(0, 255, (6,), generator=g, dtype=torch.uint8), "F8_E4M3"),
        "e5m2": (torch.randint(0, 255, (2, 3), generator=g, dtype=torch.uint8), "F8_E5M2"),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(3.5),
    }


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


def test_safe_open_matches_the_reference_parser(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample(), {"format": "pt", "note": "hand written"})
    ref, meta = reference_parse(path)
    with pinstage.safe_open(path, framework="pt", worker=worker) as f:
        assert f.keys() == list(ref)  # data order, which is the write order here
        assert f.metadata() == meta
        for name, want in ref.items():
            got = f.get_tensor(name)
            assert same(got, want), name
            assert got.is_contiguous()
            assert pinstage.is_pinned(got), name  # zero-copy view of a pinned buffer


def test_load_file_matches_the_reference_and_the_cpp_reader(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    got = pinstage.load_file(path, worker=worker, threads=3, chunk_bytes=5)
    assert list(got) == list(ref)
    for name in ref:
        assert same(got[name], ref[name]), name
    # Exactly one pinned buffer per tensor, of its bytes (1 for an empty tensor).
    want = sum(max(t.numel() * t.element_size(), 1) for t in ref.values())  # noqa: E501
    assert worker.stats().pinned_bytes == want
    # The same bytes through the C++ loader's device path.
    dev = pinstage.load_to_device(path, worker=worker)
    for name, t in ref.items():
        assert dev.to_bytes(name) == raw(t), name


def test_tensors_keep_the_worker_pinned_memory_until_collected(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, {"x": torch.arange(1000, dtype=torch.float32)})
    t = pinstage.load_file(path, worker=worker)["x"]
    assert worker.stats().pinned_count == 1
    with pytest.raises(BufferError, match="view"):
        worker.finalize()  # the tensor is a live view: finalize refuses
    assert t[999].item() == 999.0
    del t
    gc.collect()
    assert worker.stats().pinned_count == 0
    worker.finalize()


def test_sharded_checkpoint_from_the_cli_writer(worker, tmp_path, cli):
    import subprocess
    out = tmp_path / "ckpt"
    subprocess.run([str(cli), "fixture", "qwen3-decode", "--layers", "1", "--seq-len", "64",
                    "--out", str(out), "--shard-size", "64M", "--quiet"], check=True,
                   capture_output=True)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    ref = {}
    for s in shards:
        ref.update(reference_parse(out / s)[0])
    got = pinstage.load_file(out, worker=worker, verify=True)
    assert set(got) == set(ref) == set(index["weight_map"])
    for name in ref:
        assert same(got[name], ref[name]), name
    del got
    # pinstage's writer recorded every tensor's xxh3: one flipped byte is caught and named.
    first = next(n for n, s in index["weight_map"].items() if s == shards[-1])
    raw = bytearray((out / shards[-1]).read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin = json.loads(raw[8:8 + n])[first]["data_offsets"][0]
    raw[8 + n + begin] ^= 0x10
    (out / shards[-1]).write_bytes(bytes(raw))
    with pytest.raises(pinstage.Error, match=f"tensor '{first}' fails its integrity check"):
        pinstage.load_file(out, worker=worker, verify=True)
    gc.collect()
    assert worker.stats().pinned_count == 0


def test_bad_arguments(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.zeros(2)})
    with pytest.raises(pinstage.InvalidArgumentError, match="framework must be 'pt'"):
        pinstage.safe_open(path, framework="tf", worker=worker)
    with pytest.raises(TypeError, match="needs worker=pinstage.Worker"):
        pinstage.load_file(path, worker=None)
    with pytest.raises(pinstage.Error, match="no tensor 'zz'"):
        pinstage.safe_open(path, worker=worker).get_tensor("zz")
    (tmp_path / "bad.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}x")
    with pytest.raises(pinstage.Error, match="bad.safetensors"):
        pinstage.load_file(tmp_path / "bad.safetensors", worker=worker)
    assert worker.stats().pinned_count == 0


def test_paths_with_a_nul_are_refused_everywhere(worker, tmp_path):
    """'m.safetensors\\0.other' used to open m.safetensors: the C file API stops at the NUL.
    Every path argument of the Python surface refuses it instead, naming the function."""
    import pathlib

    from pinstage import _pinstage, qwen3
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.zeros(2)})
    bad = str(path) + "\0.other"
    golden = tmp_path / "g.safetensors"
    scene = {"layers": 1, "seq_len": 16}
    calls = {
        "safe_open(): path": lambda p: pinstage.safe_open(p, worker=worker),
        "load_file(): path": lambda p: pinstage.load_file(p, worker=worker),
        "load_to_device(): path": lambda p: pinstage.load_to_device(p, worker=worker),
        "_Checkpoint(): path": lambda p: _pinstage._Checkpoint(p),
        "Worker option plugin_path": lambda p: pinstage.Worker(
            plugin_path=worker.backend_path + p[len(str(path)):]),
        "run_scene: save_golden": lambda p: pinstage.run_scene(
            worker, "qwen3-decode", scene, save_golden=str(golden) + p[len(str(path)):]),
        "run_scene: save_golden ": lambda p: qwen3.run_scene(
            worker, 1, 16, save_golden=str(golden) + p[len(str(path)):]),
    }
    for who, call in calls.items():
        for value in (bad, pathlib.PurePosixPath(bad)):
            if who.startswith(("Worker", "run_scene")) and not isinstance(value, str):
                continue
            with pytest.raises(ValueError, match=re.escape(who.strip())
                               + " contains a NUL character") as e:
                call(value)
            assert isinstance(e.value, pinstage.InvalidArgumentError), who
            assert r"\x00.other" in str(e.value), who  # the whole value, NUL shown
    assert not golden.exists()  # refused before the scene ran
    assert worker.stats().pinned_count == 0


@pytest.mark.parametrize("call, message", [
    (lambda w, p: pinstage.load_file(5, worker=w),
     r"load_file\(\): path must be str or os.PathLike, not int"),
    (lambda w, p: pinstage.load_file(str(p).encode(), worker=w),
     r"load_file\(\): path must be str or os.PathLike, not bytes"),
    (lambda w, p: pinstage.load_file(p, worker=w, threads="2"),
     r"load_file\(\): threads must be int, not str"),
    (lambda w, p: pinstage.load_file(p, worker=w, threads=1.5),
     r"load_file\(\): threads must be int, not float"),
    (lambda w, p: pinstage.load_file(p, worker=w, threads=True),
     r"load_file\(\): threads must be int, not bool"),
    (lambda w, p: pinstage.load_file(p, worker=w, chunk_bytes=None),
     r"load_file\(\): chunk_bytes must be int, not NoneType"),
    (lambda w, p: pinstage.load_file(p, worker=w, verify="yes"),
     r"load_file\(\): verify must be bool or 'if-present', not str"),
    (lambda w, p: pinstage.load_file(p, worker=w, direct=None),
     r"load_file\(\): direct must be bool, not NoneType"),
    (lambda w, p: pinstage.safe_open(p, worker=w, threads="2"),
     r"safe_open\(\): threads must be int, not str"),
    (lambda w, p: pinstage.safe_open(p, worker=w, verify=1),
     r"safe_open\(\): verify must be bool or 'if-present', not int"),
    (lambda w, p: pinstage.safe_open(p, worker=w).get_tensor(3),
     r"safe_open.get_tensor\(\): name must be str, not int"),
    (lambda w, p: pinstage.safe_open(p, worker=w).info(None),
     r"safe_open.info\(\): name must be str, not NoneType"),
    (lambda w, p: pinstage.load_to_device(p, worker=w, ring_bytes="64M"),
     r"load_to_device\(\): ring_bytes must be int, not str"),
    (lambda w, p: pinstage.load_to_device(b"x", worker=w),
     r"load_to_device\(\): path must be str or os.PathLike, not bytes"),
])
def test_wrong_argument_types_name_the_public_function(worker, tmp_path, call, message):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.zeros(2)})
    with pytest.raises(TypeError, match=message) as e:
        call(worker, path)
    assert "incompatible function arguments" not in str(e.value)
    assert worker.stats().pinned_count == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk_bytes": -1}, r"load_file\(\): chunk_bytes must be >= 0, got -1"),
    ({"chunk_bytes": 2**64}, r"load_file\(\): chunk_bytes must be at most 2\*\*64 - 1"),
    ({"threads": 2**40}, r"load_file\(\): threads must be at most 2\*\*31 - 1"),
])
def test_out_of_range_integers_name_the_public_function(worker, tmp_path, kwargs, message):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.zeros(2)})
    with pytest.raises(pinstage.InvalidArgumentError, match=message):
        pinstage.load_file(path, worker=worker, **kwargs)


def test_a_finalized_worker_is_named_finalized_not_uninitialized(tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.zeros(2)})
    finalized = pinstage.Worker()
    finalized.finalize()
    with pytest.raises(pinstage.InvalidArgumentError) as e:
        pinstage.load_file(path, worker=finalized)
    assert "load_file needs an initialized chip-level worker (got a chip-level worker that " \
           "was finalized; finalize is terminal: create a new Worker)" in str(e.value)
    never = pinstage.Worker(initialize=False)
    with pytest.raises(pinstage.InvalidArgumentError) as e:
        pinstage.load_file(path, worker=never)
    assert "(got a chip-level worker that is not initialized: call init() first)" in str(e.value)


def test_verify_on_a_checkpoint_without_hashes_is_an_error_unless_if_present(worker, tmp_path):
    # An HF-style file (no pinstage metadata): verify=True used to return normally,
    # having checked nothing.
    path = tmp_path / "hf.safetensors"
    write_file(path, {"w": torch.arange(12, dtype=torch.float32), "b": torch.ones(3)})
    for call in (lambda v: pinstage.load_file(path, worker=worker, verify=v),
                 lambda v: pinstage.safe_open(path, worker=worker, verify=v).get_tensor("w"),
                 lambda v: pinstage.load_to_device(path, worker=worker, verify=v)):
        with pytest.raises(pinstage.InvalidArgumentError,
                           match=r"verify cannot check \d of \d tensors.*--verify=if-present"):
            call(True)
    assert worker.stats().pinned_count == 0
    got = pinstage.load_file(path, worker=worker, verify="if-present")
    assert torch.equal(got["w"], torch.arange(12, dtype=torch.float32))
    dev = pinstage.load_to_device(path, worker=worker, verify="if-present")
    assert (dev.report["verified"], dev.report["unverified"]) == (False, 2)
    assert dev.report["verify_readback_bytes"] == 0
    dev.close()


def test_worker_is_a_required_keyword_everywhere(worker, tmp_path):
    """The signatures say what the functions do: `worker` has no default (there is no
    implicit worker) and is keyword-only; leaving it out, passing None, or passing it
    where load_file's second positional argument (device, as in safetensors) goes are
    TypeErrors that say so."""
    import inspect
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.zeros(2)})
    calls = {"load_file": pinstage.load_file, "load_to_device": pinstage.load_to_device,
             "safe_open": pinstage.safe_open}
    for who, fn in calls.items():
        p = inspect.signature(fn).parameters["worker"]
        assert (p.kind, p.default) == (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty)
        with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: "
                                            r"'worker'"):
            fn(path)
        with pytest.raises(TypeError, match=who + r" needs worker=pinstage.Worker, got "
                                                  r"NoneType"):
            fn(path, worker=None)
    assert list(inspect.signature(pinstage.load_file).parameters)[:3] == [
        "path", "device", "worker"]
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'worker'"):
        pinstage.load_file(path, worker)  # worker positionally: it is not the device
    with pytest.raises(TypeError, match=r"load_file\(\): device must be str or "
                                        r"torch.device, not Worker"):
        pinstage.load_file(path, worker, worker=worker)
    with pytest.raises(TypeError, match=r"takes from 2 to 3 positional arguments but 4 were given"):
        pinstage.safe_open(path, "pt", worker)
    assert worker.stats().pinned_count == 0
