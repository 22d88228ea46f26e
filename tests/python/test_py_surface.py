"""The Pythonic surface (issue 12): torch's call forms on the allocator, randn from
pinstage's generator, pinstage.is_pinned, reprs, finalize(wait=, timeout=), and
finalize's refusal naming the holders."""
import gc
import threading

import numpy as np
import pytest
import torch

import pinstage


def test_torch_call_forms(alloc):
    assert alloc.empty(2, 4).shape == (2, 4) and alloc.empty(2, 4).dtype == torch.float32
    assert alloc.empty((2, 4)).shape == (2, 4)
    assert alloc.empty(torch.Size([3, 1]), dtype=torch.int16).dtype == torch.int16
    assert alloc.empty([5]).shape == (5,) and alloc.empty(np.int64(6)).shape == (6,)
    assert alloc.empty((2, 2), torch.float64).dtype == torch.float64  # the older form
    assert torch.equal(alloc.zeros(2, 3, dtype=torch.bfloat16),
                       torch.zeros(2, 3, dtype=torch.bfloat16))
    assert torch.equal(alloc.ones(4, dtype=torch.int8), torch.ones(4, dtype=torch.int8))
    assert alloc.full((2,), 7).dtype == torch.int64  # inferred as torch.full does
    assert alloc.full((2,), True).dtype == torch.bool
    assert alloc.full((2,), 0.5).dtype == torch.float32
    assert torch.equal(alloc.full((2, 2), 3.0, dtype=torch.float16),
                       torch.full((2, 2), 3.0, dtype=torch.float16))
    src = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    z = alloc.zeros_like(src)
    assert z.shape == src.shape and z.dtype == src.dtype and not z.any()
    assert alloc.empty_like(src, dtype=torch.float64).dtype == torch.float64
    for t in (z, alloc.ones(3), alloc.full((1,), 2)):
        assert pinstage.is_pinned(t) and alloc.is_pinned(t)
    with pytest.raises(TypeError, match="dtype given both positionally and as a keyword"):
        alloc.empty((2,), torch.float32, dtype=torch.float32)


def test_randn_is_pinstages_generator_and_deterministic_per_seed(alloc):
    a = alloc.randn(256, 256, seed=5)
    b = alloc.randn((256, 256), seed=5)
    c = alloc.randn(256, 256, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.mean().item()) < 0.02 and abs(a.std().item() - 1) < 0.02
    torch.manual_seed(0)
    assert torch.equal(alloc.randn(64, seed=1), (torch.manual_seed(99), alloc.randn(64, seed=1))[1])
    h = alloc.randn(1000, dtype=torch.bfloat16, seed=5, std=2.0, bias=1.0)
    assert h.dtype == torch.bfloat16 and abs(h.float().mean().item() - 1.0) < 0.3
    # The same generator the fixture uses: stream 0 of seed 5, as f32 then bf16.
    assert torch.equal(alloc.randn(1000, dtype=torch.bfloat16, seed=5),
                       a.flatten()[:1000].bfloat16())
    with pytest.raises(pinstage.InvalidArgumentError, match="dtype must be one of float32"):
        alloc.randn(4, dtype=torch.float64)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"seed must be in \[0, 2\*\*64"):
        alloc.randn(4, seed=-1)


def test_is_pinned_answers_for_any_tensor(worker, alloc):
    assert not pinstage.is_pinned(torch.ones(4))
    assert pinstage.is_pinned(alloc.ones(4))
    view = alloc.ones(16)[4:8]
    assert pinstage.is_pinned(view)
    with pytest.raises(TypeError, match="is_pinned needs a torch.Tensor"):
        pinstage.is_pinned([1])


def test_reprs_say_what_they_are(worker):
    b = worker.alloc_pinned_host(64)
    args = pinstage.TaskArgs()
    args.add("x", torch.ones(4))
    report = pinstage.Binder(worker).run(args)
    for obj, text in [(worker, "<pinstage.Worker level=chip backend=sim"),
                      (b, "<pinstage.PinnedHostBuffer nbytes=64"),
                      (args, "<pinstage.TaskArgs"), (report, "<pinstage.BindReport"),
                      (report.tensors[0], "<pinstage.TensorBindReport x"),
                      (worker.stats(), "WorkerStats(pinned_bytes=")]:
        assert repr(obj).startswith(text), repr(obj)


def test_finalize_wait_returns_once_views_drop(worker, alloc):
    held = [alloc.ones(8)]
    drop = threading.Event()

    def holder():
        drop.wait()
        held.clear()  # needs the GIL, which finalize(wait=True) lets go between looks

    thread = threading.Thread(target=holder)
    thread.start()
    drop.set()
    worker.finalize(wait=True)
    thread.join()
    assert worker.finalized


def test_finalize_wait_collects_cycles_and_times_out_naming_holders(worker, alloc):
    cycle = [alloc.ones(8)]
    cycle.append(cycle)
    del cycle
    with pytest.raises(BufferError, match="1 live view"):
        worker.finalize()  # the cycle is not collected yet
    kept = worker.alloc_pinned_host(4096)
    view = memoryview(kept)
    with pytest.raises(BufferError, match=r"PinnedHostBuffer at 0x[0-9a-f]+ \(4096 bytes\): "
                                          r"1 view\(s\)"):
        worker.finalize(wait=True, timeout=0.01)  # the cycle went, the memoryview stays
    view.release()
    worker.finalize(wait=True, timeout=0)
    assert worker.finalized
    with pytest.raises(pinstage.InvalidArgumentError, match="timeout must be >= 0"):
        pinstage.Worker().finalize(wait=True, timeout=-1)
