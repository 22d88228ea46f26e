"""One dtype set: every dtype the PinnedTorchAllocator hands out is one TaskArgs accepts,
binds (the upload verified byte for byte) and reads back, including the raw-storage ones
(bool, uint8, int8, int16, float64, float8 where torch has them)."""
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
