"""PinnedTorchAllocator: torch tensors in a worker's pinned memory, with the C++ guard
and shape/dtype validation."""
import gc

import pytest
import torch

import pinstage
from pinstage import PinnedTorchAllocator


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32,
                                   torch.int64, torch.uint8, torch.bool, torch.float64,
                                   torch.int8, torch.int16])
def test_tensors_are_contiguous_cpu_and_pinned(alloc, worker, dtype):
    t = alloc.zeros((3, 5, 7), dtype)
    assert t.dtype == dtype and t.shape == (3, 5, 7)
    assert t.device.type == "cpu" and t.is_contiguous()
    assert alloc.is_pinned(t) and not alloc.is_pinned(torch.zeros(3))
    assert (t == 0).all()
    assert worker.stats().pinned_count == 1 and worker.live_views == 1
    del t
    gc.collect()
    assert worker.stats().pinned_count == 0 and worker.live_views == 0


def test_helpers_fill_as_documented(alloc):
    assert alloc.full((4,), 2.5).tolist() == [2.5] * 4
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a = alloc.normal((1000,), std=2.0, bias=5.0, generator=g1)
    b = torch.empty(1000).normal_(mean=5.0, std=2.0, generator=g2)
    assert torch.equal(a, b)  # same draws as torch's own normal_
    src = torch.randn(4, 6).t()  # non-contiguous source
    c = alloc.copy(src)
    assert torch.equal(c, src) and c.is_contiguous() and alloc.is_pinned(c)
    e = alloc.empty_like(src)
    assert e.shape == src.shape and e.dtype == src.dtype
    assert alloc.empty(()).shape == () and alloc.empty(5).shape == (5,)


def test_zero_element_tensor_is_still_pinned(alloc):
    t = alloc.empty((0, 16), torch.bfloat16)
    assert t.shape == (0, 16) and t.numel() == 0
    assert t.is_contiguous()


def test_shapes_are_validated(alloc, worker):
    cases = [
        ((-1, 4), r"shape\[0\] must be >= 0, got -1"),
        ((2, 2.0), r"shape\[1\] must be an int, got float"),
        ((True, 2), r"shape\[0\] must be an int, got True"),
        ("abc", r"shape\[0\] must be an int"),
        (None, "shape must be a sequence of non-negative ints"),
        ((1 << 32, 1 << 32), "overflows"),
        ((1 << 62,), "overflows"),  # 2**62 float32 elements: 2**64 bytes
    ]
    for shape, message in cases:
        with pytest.raises(pinstage.InvalidArgumentError, match=message):
            alloc.empty(shape, torch.float32)
    with pytest.raises(pinstage.InvalidArgumentError, match="physical memory"):
        alloc.empty((1 << 40, 1 << 20), torch.uint8)  # fits int64, not the machine
    assert worker.stats().pinned_count == 0


def test_dtypes_are_validated(alloc):
    for bad in ("float32", float, torch.quint8):
        with pytest.raises(pinstage.InvalidArgumentError, match="dtype must be one of"):
            alloc.empty((2,), dtype=bad)
    with pytest.raises(pinstage.InvalidArgumentError, match="dtype must be one of float32"):
        alloc.normal((2,), dtype=torch.int32)
    with pytest.raises(TypeError, match="needs a torch.Tensor"):
        alloc.empty_like([1, 2])


def test_guard_rejects_workers_that_own_no_device():
    """One rule, one message: the C++ require_chip_worker guard."""
    with pytest.raises(TypeError, match="needs a pinstage.Worker, got str"):
        PinnedTorchAllocator("sim")
    # `chip` is the only level a Worker can have; `node` is a WorkerGroup's, and any
    # other level is unknown: both refused when the Worker is made.
    with pytest.raises(pinstage.InvalidArgumentError, match="the node level is a WorkerGroup"):
        pinstage.Worker(level="node")
    with pytest.raises(pinstage.InvalidArgumentError, match="unknown worker level"):
        pinstage.Worker(level="rack")
    for w in (pinstage.Worker(initialize=False), pinstage.Worker()):
        if w.initialized:
            w.finalize()
        with pytest.raises(pinstage.InvalidArgumentError) as e:
            PinnedTorchAllocator(w)
        with pytest.raises(pinstage.InvalidArgumentError) as shared:
            pinstage.require_chip_worker(w, "PinnedTorchAllocator")
        assert str(e.value) == str(shared.value)
        assert "PinnedTorchAllocator needs an initialized chip-level worker" in str(e.value)
        assert e.value.code == "invalid_argument"


def test_allocator_after_finalize_raises_finalized(worker):
    alloc = PinnedTorchAllocator(worker)
    worker.finalize()
    with pytest.raises(pinstage.Error) as e:
        alloc.empty((4,))
    assert e.value.code == "finalized"


def test_finalize_refuses_while_allocator_tensors_live(alloc, worker):
    t = alloc.zeros((8,), torch.int64)
    u = t[2:4]  # a torch view shares the same DLPack export
    with pytest.raises(BufferError, match=r"1 live view"):
        worker.finalize()
    del t
    u.fill_(3)
    with pytest.raises(BufferError):
        worker.finalize()
    del u
    worker.finalize()
