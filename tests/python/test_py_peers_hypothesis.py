"""Property tests (hypothesis): pinstage's safetensors reader against the reference writer
and reader on generated checkpoints and on damaged ones, and PinnedTorchAllocator's calls
against torch's own factories.

The reader properties need the `safetensors` package (the venv pass; skipped under Debian,
where the allocator properties still run on torch 1.13). Example counts are small and
fixed, and the database is off, so a run is deterministic in what it may find and takes
seconds; PINSTAGE_HYPOTHESIS_EXAMPLES raises the counts for a longer search."""
import gc
import os
import struct

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import torch  # noqa: E402

import pinstage  # noqa: E402

EXAMPLES = int(os.environ.get("PINSTAGE_HYPOTHESIS_EXAMPLES", "40"))
SETTINGS = dict(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def _raw(t):
    """A tensor's bytes in row-major order. Copied into a fresh 1-D tensor first: a view
    with a size-1 dim can keep a stride other than 1 even when contiguous()."""
    if not t.numel():
        return b""
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()  # torch 1.13 has no dtype.itemsize


def _same(got, want):
    return got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape) and \
        _raw(got) == _raw(want)


# --- the reader against the reference writer and reader ------------------------------

REQUIRED = os.environ.get("PINSTAGE_REQUIRE_PEERS") == "1"
try:
    import safetensors.torch as st_torch
except ImportError:
    if REQUIRED:  # the venv pass: the reference must be there
        raise
    st_torch = None
needs_reference = pytest.mark.skipif(st_torch is None,
                                     reason="no safetensors package (the venv pass runs this)")
DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
          "I32": torch.int32, "I64": torch.int64, "F16": torch.float16,
          "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.update(F8_E4M3=torch.float8_e4m3fn, F8_E5M2=torch.float8_e5m2)
DTYPES.update({n: getattr(torch, a) for n, a in (("U16", "uint16"), ("U32", "uint32"),
                                                  ("U64", "uint64")) if hasattr(torch, a)})


@st.composite
def checkpoints(draw):
    """{name: tensor} of any shared dtype and small shape (0-d and empty included), with
    arbitrary bytes, and {str: str} metadata."""
    dtypes = DTYPES
    names = draw(st.lists(st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF),
                                  min_size=1, max_size=12).filter(lambda s: s != "__metadata__"),
                          min_size=1, max_size=6, unique=True))
    out = {}
    for name in names:
        dtype = dtypes[draw(st.sampled_from(sorted(dtypes)))]
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        nbytes = _itemsize(dtype) * (torch.Size(shape).numel())
        data = draw(st.binary(min_size=nbytes, max_size=nbytes))
        flat = torch.frombuffer(bytearray(data) or bytearray(1), dtype=torch.uint8)[:nbytes]
        if dtype == torch.bool:  # only 0 and 1 are bools
            flat = flat & 1
        out[name] = flat.view(dtype).reshape(shape).clone()
    # The empty key too: the reference writes and reads it, and so does pinstage.
    meta = draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8),
                                max_size=3))
    return out, meta or None


@needs_reference
@settings(**SETTINGS)
@given(checkpoints())
def test_whatever_the_reference_writes_pinstage_reads_byte_exact(worker, tmp_path, ckpt):
    tensors, meta = ckpt
    path = tmp_path / "h.safetensors"
    st_torch.save_file(tensors, path, metadata=meta)
    with pinstage.safe_open(path, worker=worker) as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert f.metadata() == (meta or {})
        got = {n: f.get_tensor(n) for n in f.keys()}
    for name, want in tensors.items():
        assert _same(got[name], want), name
    del got
    gc.collect()


@needs_reference
@settings(**SETTINGS)
@given(checkpoints(), st.data())
def test_a_slice_reads_what_torch_indexing_gives(worker, tmp_path, ckpt, data):
    tensors, _ = ckpt
    path = tmp_path / "s.safetensors"
    st_torch.save_file(tensors, path)
    name = data.draw(st.sampled_from(sorted(tensors)))
    want = tensors[name]
    index = tuple(data.draw(st.one_of(
        st.integers(-n, n - 1) if n else st.nothing(),
        st.builds(slice, st.none() | st.integers(-6, 6), st.none() | st.integers(-6, 6),
                  st.none() | st.integers(1, 3)))) for n in want.shape)
    with pinstage.safe_open(path, worker=worker) as f:
        got = f.get_slice(name)[index]
    assert _same(got, want[index].contiguous()), (name, index)
    del got
    gc.collect()


def _reference_accepts(blob):
    try:
        return st_torch.load(blob)
    except Exception:
        return None


@needs_reference
@settings(**dict(SETTINGS, max_examples=EXAMPLES * 3))
@given(st.data())
def test_a_damaged_file_is_refused_or_read_as_the_reference_reads_it(worker, tmp_path, data):
    """Differential: one to four bytes of a valid file overwritten, anywhere (length prefix,
    header, data). pinstage never accepts a file the reference refuses, and what both
    accept they read the same. (pinstage may refuse more: it is stricter, e.g. repeated
    keys.)"""
    blob = bytearray(st_torch.save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                                    "b": torch.tensor([7, -8], dtype=torch.int64),
                                    "c": torch.zeros(0, dtype=torch.bfloat16)},
                                   metadata={"k": "v"}))
    (n,) = struct.unpack("<Q", blob[:8])
    # Mostly inside the header, where the parser is; sometimes anywhere.
    where = data.draw(st.one_of(st.integers(8, 8 + n - 1), st.integers(0, len(blob) - 1)))
    for i, b in enumerate(data.draw(st.binary(min_size=1, max_size=4))):
        if where + i < len(blob):
            blob[where + i] = b
    blob = bytes(blob)
    theirs = _reference_accepts(blob)
    path = tmp_path / "d.safetensors"
    path.write_bytes(blob)
    try:
        ours = pinstage.load_file(path, worker=worker)
    except pinstage.Error:
        ours = None
    if ours is not None:
        assert theirs is not None, "pinstage accepted a file the reference refuses"
        assert sorted(ours) == sorted(theirs)
        for name in ours:
            assert _same(ours[name], theirs[name]), name
    del ours
    gc.collect()


# --- PinnedTorchAllocator against torch's factories -----------------------------------

_ALLOC_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                 torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool] + \
    [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
_shapes = st.lists(st.integers(0, 6), max_size=4).map(tuple)


def _fill_for(dtype):
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        return st.sampled_from([0.0, 1.0, -2.5, 0.125])  # exact in every float dtype
    info = torch.iinfo(dtype)
    return st.integers(info.min, info.max)


_METHODS = ["zeros", "ones", "empty", "full", "zeros_like", "copy"]


def alloc_call(method, dtype, draw):
    """(args, kwargs, what torch gives for the same call) of one call of `method`."""
    shape = draw(_shapes)
    form = draw(st.sampled_from(["ints", "tuple", "size"]))
    size = shape if form == "ints" else (shape,) if form == "tuple" else (torch.Size(shape),)
    if form == "ints" and not shape:
        size = ((),)  # empty(*()) would be torch's 0-d call form; keep it explicit
    if method == "full":
        value = draw(_fill_for(dtype))
        return (shape, value), {"dtype": dtype}, ("full", shape, value, dtype)
    if method in ("zeros_like", "copy"):
        source = torch.zeros(shape, dtype=torch.uint8)
        if source.numel():
            source = torch.tensor(draw(st.lists(st.integers(0, 255), min_size=source.numel(),
                                                max_size=source.numel())),
                                  dtype=torch.uint8).reshape(shape)
        if dtype == torch.bool:
            source = source & 1
        source = source.view(dtype) if _itemsize(dtype) == 1 else source.to(dtype)
        return (source,), {}, (method, source)
    return size, {"dtype": dtype}, (method, shape, dtype)


def _torch_result(spec):
    """What torch's own factory gives for the call (None: contents unspecified). float8
    through float32 and a cast, the way such tensors are made in torch."""
    method = spec[0]
    if method == "copy":
        return spec[1]
    if method == "zeros_like":
        return torch.zeros(spec[1].shape, dtype=torch.uint8).view(spec[1].dtype) \
            if _itemsize(spec[1].dtype) == 1 else torch.zeros_like(spec[1])
    if method == "empty":
        return None
    shape, dtype = spec[1], spec[-1]
    value = spec[2] if method == "full" else 1 if method == "ones" else 0
    if dtype.is_floating_point and _itemsize(dtype) == 1:
        return torch.full(shape, float(value)).to(dtype)
    return torch.full(shape, value, dtype=dtype)


# Every (method, dtype) pair is a test of its own, so none is left to the draw; hypothesis
# picks the shapes, call forms and values.
@pytest.mark.parametrize("dtype", _ALLOC_DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("method", _METHODS)
@settings(**dict(SETTINGS, max_examples=max(2, EXAMPLES // 20)))
@given(data=st.data())
def test_allocator_calls_give_pinned_tensors_as_torch_would(worker, method, dtype, data):
    args, kwargs, spec = alloc_call(method, dtype, data.draw)
    alloc = pinstage.PinnedTorchAllocator(worker)
    before = worker.stats()
    t = getattr(alloc, method)(*args, **kwargs)
    want = _torch_result(spec)
    shape = spec[1].shape if method in ("zeros_like", "copy") else spec[1]
    assert tuple(t.shape) == tuple(shape) and t.is_contiguous() and t.device.type == "cpu"
    assert t.dtype == (spec[1].dtype if method in ("zeros_like", "copy") else spec[-1])
    assert pinstage.is_pinned(t) and alloc.is_pinned(t)
    if want is not None:
        assert _raw(t) == _raw(want)
    # One pinned buffer per call, of at least the tensor's bytes (one page when empty),
    # given back when the tensor goes.
    after = worker.stats()
    assert after.pinned_count == before.pinned_count + 1
    assert after.pinned_bytes - before.pinned_bytes >= max(t.numel() * t.element_size(), 1)
    del t  # no cycle holds it: the buffer goes at once, no gc.collect() needed
    assert worker.stats().pinned_count == before.pinned_count


@settings(**SETTINGS)
@given(st.lists(st.integers(-3, 4), min_size=1, max_size=3).filter(lambda s: min(s) < 0))
def test_a_negative_dimension_is_refused_naming_it(worker, shape):
    alloc = pinstage.PinnedTorchAllocator(worker)
    bad = next(i for i, d in enumerate(shape) if d < 0)
    with pytest.raises(pinstage.InvalidArgumentError, match=rf"shape\[{bad}\] must be >= 0"):
        alloc.empty(shape)
    assert worker.stats().pinned_count == 0
