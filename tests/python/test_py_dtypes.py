"""One dtype set: every dtype the PinnedTorchAllocator hands out is one TaskArgs accepts,
binds (the upload verified byte for byte) and reads back, including the raw-storage ones
(bool, uint8, int8, int16, float64, float8 where torch has them)."""
import pathlib
import re
import warnings

import pytest
import torch

import pinstage
from pinstage import Binder, TaskArgs

RAW = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.float64]
RAW += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
ALL = [torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64] + RAW


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_allocator_dtype_binds_through_task_args(worker, alloc, dtype):
    x = alloc.empty(3, 5, dtype=dtype)
    raw = x.reshape(-1).view(torch.uint8)
    raw.copy_(torch.arange(raw.numel(), dtype=torch.int64).remainder(251).to(torch.uint8))
    y = alloc.zeros(3, 5, dtype=dtype)
    y_raw = y.reshape(-1).view(torch.uint8)
    pattern = torch.arange(y_raw.numel(), dtype=torch.int64).mul(7).add(3).remainder(256)
    y_raw.copy_(pattern.to(torch.uint8))
    args = TaskArgs()
    args.add("x", x)
    args.add("y", y, "inout")
    report = Binder(worker, verify_upload=True).run(args)
    nbytes = x.numel() * x.element_size()
    assert report.uploaded_bytes == 2 * nbytes  # verify_upload compared them byte for byte
    assert report.downloaded_bytes == nbytes
    assert pinstage.is_pinned(x) and pinstage.is_pinned(y)
    # The round trip kept every byte of y (uploaded, then read back over it).
    assert bool((y_raw == pattern.to(torch.uint8)).all())
    del x, y, raw, y_raw, args


def test_a_dtype_outside_the_set_is_refused_by_the_allocator(alloc):
    with pytest.raises(Exception, match="complex64"):
        alloc.empty(2, dtype=torch.complex64)


DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def torch_dtypes():
    """Every dtype this torch has, by its canonical name (aliases such as torch.float fold)."""
    found = {getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    return {str(d).replace("torch.", ""): d for d in found}


def documented_dtypes():
    """The allocator's dtype list in docs/python.md, with the optional kinds this torch has."""
    text = " ".join(DOC.read_text().split())
    m = re.search(r"`dtype` must be one of ([a-z0-9_, ]+?)(?:; also ([a-z0-9_, ]+?) on a torch "
                  r"that has them)? \(else `InvalidArgumentError`\)", text)
    assert m, "docs/python.md lost its PinnedTorchAllocator dtype sentence"
    always = [n.strip() for n in m.group(1).split(",")]
    optional = [n.strip() for n in re.split(r",| and ", m.group(2) or "") if n.strip()]
    return set(always) | {n for n in optional if hasattr(torch, n)}


def test_the_documented_dtypes_are_the_ones_the_allocator_accepts(alloc):
    accepted = set()
    for name, dtype in torch_dtypes().items():
        try:
            t = alloc.empty(2, dtype=dtype)
        except pinstage.InvalidArgumentError as e:
            assert "dtype must be one of" in str(e), (name, e)
            continue
        assert t.dtype == dtype and pinstage.is_pinned(t), name
        accepted.add(name)
        del t
    assert accepted == documented_dtypes()


HOWTO = DOC.with_name("howto-stage-torch.md")


def howto_dtypes():
    """The dtypes docs/howto-stage-torch.md says TaskArgs accepts (it once said five)."""
    text = " ".join(HOWTO.read_text().split())
    m = re.search(r"tensors of the dtypes ([a-z0-9_, ]+?) and ([a-z0-9_]+) \(also "
                  r"([a-z0-9_, ]+?) on a torch that has them\), contiguous and on the CPU, "
                  r"are accepted", text)
    assert m, "docs/howto-stage-torch.md lost its TaskArgs dtype sentence"
    always = [n.strip() for n in m.group(1).split(",")] + [m.group(2)]
    optional = [n.strip() for n in re.split(r",| and ", m.group(3)) if n.strip()]
    return set(always) | {n for n in optional if hasattr(torch, n)}


def task_args_accepted():
    """({dtype name TaskArgs.add takes}, the text of one refusal)."""
    accepted, refusal = set(), None
    for name, dtype in torch_dtypes().items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # complex32: "experimental"
                t = torch.zeros(2, dtype=dtype)
        except (RuntimeError, TypeError):
            continue  # quantized kinds: no plain tensor to pass
        try:
            TaskArgs().add("x", t)
        except pinstage.InvalidArgumentError as e:
            refusal = str(e)
            continue
        accepted.add(name)
    return accepted, refusal


def test_the_howto_lists_exactly_the_dtypes_task_args_accept():
    accepted, _ = task_args_accepted()
    assert len(accepted) >= 10  # ten, and the float8 kinds on a torch that has them
    assert howto_dtypes() == accepted


def test_task_args_accept_exactly_the_documented_dtypes():
    """TaskArgs.add takes the same set (docs/python.md says so), and its refusal lists it."""
    accepted, refusal = task_args_accepted()
    assert accepted == documented_dtypes()
    listed = refusal.split("supported: ")[1].split("; ")[0]
    assert set(listed.split(", ")) == accepted, refusal
    text = " ".join(DOC.read_text().split())
    assert "CPU torch tensor of one of the allocator's dtypes" in text
