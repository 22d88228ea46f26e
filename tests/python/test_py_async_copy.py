"""Non-blocking copies from Python: Worker.alloc_device, copy_to_device_async and
copy_to_host_async return a CopyEvent (wait(), query()); what it holds until the copy is
known complete, and what finalize() does with one pending (Note [Pending copies] in
python/src/device.cpp). The sim backend's stream hold (Worker._hold_streams) keeps a copy
queued for as long as a test needs: no sleeps, no timing."""
import gc

import pytest
import torch

import pinstage


@pytest.fixture
def held(worker):
    """The worker with its sim streams held: queued copies wait until released."""
    worker._hold_streams(True)
    try:
        yield worker
    finally:
        if worker.initialized:
            worker._hold_streams(False)


def test_upload_and_download_round_trip(worker, alloc):
    src = alloc.randn(1000, seed=3)
    back = alloc.zeros(1000)
    dev = worker.alloc_device(src.numel() * 4 + 64)
    up = worker.copy_to_device_async(dev, src, 64)
    assert (up.direction, up.nbytes) == ("to_device", 4000)
    down = worker.copy_to_host_async(back, dev, 64)  # same stream: after the upload
    down.wait()
    assert down.done and down.query()
    assert up.query() and up.done  # the stream runs in order: the upload came first
    assert torch.equal(back, src)
    # A PinnedHostBuffer works as the host side too.
    buf = worker.alloc_pinned_host(64)
    worker.copy_to_host_async(buf, dev, 64).wait()
    assert bytes(memoryview(buf)) == src.view(torch.uint8)[:64].numpy().tobytes()


def test_query_says_pending_until_the_copy_ran_and_wait_waits(held, alloc):
    worker = held
    src = alloc.full((256,), 7, dtype=torch.int32)
    dev = worker.alloc_device(1024)
    ev = worker.copy_to_device_async(dev, src)
    assert ev.query() is False and not ev.done
    assert dev.pending_copies == 1
    assert "pending" in repr(ev)
    worker._hold_streams(False)
    ev.wait()
    assert ev.done and ev.query() is True and dev.pending_copies == 0
    back = alloc.zeros(256, dtype=torch.int32)
    worker.copy_to_host_async(back, dev).wait()
    assert torch.equal(back, src)


def test_finalize_and_close_refuse_while_a_copy_is_pending(held, alloc):
    worker = held
    src = alloc.ones(64)
    dev = worker.alloc_device(256)
    ev = worker.copy_to_device_async(dev, src)
    with pytest.raises(BufferError, match=r"1 async copy\(ies\) are still pending; wait\(\) "
                                          r"their CopyEvents first"):
        worker.finalize()
    with pytest.raises(BufferError, match=r"pending async copy\(ies\) use it"):
        dev.close()
    # The buffer under `src` stays leased by the copy when the tensor goes, and its
    # worker's refusal names the copy.
    del src
    gc.collect()
    assert worker.live_views == 1
    worker._hold_streams(False)
    ev.wait()
    assert worker.live_views == 0
    dev.close()
    assert dev.closed
    del ev
    worker.finalize()
    assert worker.finalized


def test_a_collected_event_waits_for_its_copy_and_lets_go(held, alloc):
    """Dropping a pending CopyEvent without wait(): its destructor waits for the copy
    (holding the GIL), so the memory it used is never released under a running copy."""
    worker = held
    src = alloc.copy(torch.arange(100, dtype=torch.int64))
    dev = worker.alloc_device(800)
    ev = worker.copy_to_device_async(dev, src)
    assert ev.query() is False
    worker._hold_streams(False)  # else the destructor would wait forever
    del ev
    gc.collect()
    assert dev.pending_copies == 0
    back = alloc.zeros(100, dtype=torch.int64)
    worker.copy_to_host_async(back, dev).wait()
    assert torch.equal(back, src)


def test_bad_arguments(worker, alloc):
    other = pinstage.Worker()
    dev = worker.alloc_device(16)
    t = alloc.zeros(4)
    views = worker.live_views
    cases = [
        (lambda: worker.alloc_device(0), pinstage.InvalidArgumentError,
         r"alloc_device: nbytes must be >= 1, got 0"),
        (lambda: worker.alloc_device("8"), pinstage.InvalidArgumentError,
         r"alloc_device: nbytes must be an int, got str"),
        (lambda: worker.copy_to_device_async(dev, torch.zeros(4)), pinstage.InvalidArgumentError,
         r"copy_to_device_async: the host memory \(16 bytes\) is not inside one open pinned "
         r"buffer of this worker \(pageable memory could be freed while the copy runs\)"),
        (lambda: worker.copy_to_device_async(dev, pinstage.PinnedTorchAllocator(other).zeros(4)),
         pinstage.InvalidArgumentError, r"\(it is another worker's pinned memory\)"),
        (lambda: worker.copy_to_device_async(dev, alloc.zeros(8).t().contiguous()[::2]),
         pinstage.InvalidArgumentError, r"copy_to_device_async: the host tensor is not "
                                        r"contiguous"),
        (lambda: worker.copy_to_device_async(dev, t, 4), pinstage.InvalidArgumentError,
         r"copy_to_device_async: 16 bytes at offset 4 do not fit the DeviceBuffer of 16 bytes"),
        (lambda: worker.copy_to_host_async(t, dev, -1), pinstage.InvalidArgumentError,
         r"copy_to_host_async: 16 bytes at offset -1 do not fit"),
        (lambda: worker.copy_to_device_async(t, dev), TypeError,
         r"copy_to_device_async: the device side must be a pinstage.DeviceBuffer, not Tensor"),
        (lambda: worker.copy_to_device_async(dev, b"xxxx"), TypeError,
         r"the host side must be a torch.Tensor or a pinstage.PinnedHostBuffer, not bytes"),
        (lambda: other.copy_to_device_async(dev, t), pinstage.InvalidArgumentError,
         r"copy_to_device_async: the DeviceBuffer belongs to another worker"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert dev.pending_copies == 0 and worker.live_views == views
    closed = worker.alloc_device(16)
    closed.close()
    closed.close()  # idempotent
    with pytest.raises(ValueError, match=r"the DeviceBuffer is closed"):
        worker.copy_to_device_async(closed, t)
    gc.collect()
    other.finalize()


def test_a_failed_copy_is_raised_by_wait_once_and_frees_the_memory(worker, alloc):
    src = alloc.ones(16)
    dev = worker.alloc_device(64)
    worker.inject_fault("copy_h2d", 1)
    ev = worker.copy_to_device_async(dev, src)  # sim: the stream's copy fails
    with pytest.raises(pinstage.Error, match=r"injected fault on copy_h2d"):
        ev.wait()
    assert ev.done
    ev.wait()  # raised once; now a no-op
    assert dev.pending_copies == 0 and worker.live_views == 1  # src's own view only
    dev.close()


def test_after_finalize_a_device_buffer_is_closed(worker):
    dev = worker.alloc_device(16)
    worker.finalize()
    assert dev.closed
    dev.close()  # harmless
    with pytest.raises(ValueError, match="closed"):
        dev.device_ptr
