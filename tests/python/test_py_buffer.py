"""PinnedHostBuffer: views through the buffer protocol and DLPack share its memory, keep
it alive, and are counted so close() and finalize() never free memory a view still uses."""
import gc
import itertools
import weakref

import numpy as np
import pytest
import torch

import pinstage


def test_views_share_memory_with_the_buffer(worker):
    b = worker.alloc_pinned_host(4096)
    assert b.nbytes == len(b) == 4096 and not b.closed and b.worker is worker
    mv = memoryview(b)
    assert (mv.format, mv.itemsize, mv.shape, mv.readonly) == ("B", 1, (4096,), False)
    arr = np.frombuffer(b, dtype=np.float32)
    ten = torch.from_dlpack(b)
    assert ten.dtype == torch.uint8 and ten.shape == (4096,) and ten.is_contiguous()
    assert b.live_views == 3 and worker.live_views == 3

    arr[1] = 3.5  # write through NumPy
    assert ten[4:8].view(torch.float32).item() == 3.5  # read through torch
    assert mv[4:8].cast("f")[0] == 3.5  # and through memoryview
    ten[100] = 7  # write through torch
    assert mv[100] == 7 and arr.view(np.uint8)[100] == 7
    mv[200] = 9  # write through memoryview
    assert ten[200].item() == 9 and arr.view(np.uint8)[200] == 9
    assert mv.obj.buffer is b and np.asarray(b).ctypes.data == ten.data_ptr()


def test_dlpack_protocol_details(worker):
    b = worker.alloc_pinned_host(256)
    assert b.__dlpack_device__() == (1, 0)  # kDLCPU on sim
    capsule = b.__dlpack__()
    assert "dltensor" in repr(capsule)
    assert b.live_views == 1  # an unconsumed capsule is a live view
    t = torch.from_dlpack(capsule)
    assert "used_dltensor" in repr(capsule)  # the consumer renamed what it took
    del capsule
    assert b.live_views == 1  # now held by the tensor
    del t
    assert b.live_views == 0
    capsule = b.__dlpack__(stream=None, dl_device=(1, 0))
    del capsule  # never consumed: the capsule's destructor ends the view
    assert b.live_views == 0
    with pytest.raises(BufferError, match="kDLCUDAHost = 3 for the cuda backend"):
        b.__dlpack__(dl_device=(3, 0))  # sim memory is not CUDA host memory
    assert b.__dlpack__(copy=True) is not None and b.live_views == 0  # a copy: no view
    a = np.from_dlpack(b)  # NumPy takes kDLCPU capsules too (as a read-only view)
    memoryview(b)[0] = 5
    assert a[0] == 5 and b.live_views == 1


def test_drop_worker_first_then_tensors():
    worker = pinstage.Worker()
    b = worker.alloc_pinned_host(1 << 16)
    ten = torch.from_dlpack(b).view(torch.int32)
    arr = np.frombuffer(b, dtype=np.int32)
    mv = memoryview(b).cast("i")
    ten.copy_(torch.arange(ten.numel(), dtype=torch.int32))
    w_ref = weakref.ref(worker)
    del b, worker
    gc.collect()
    # The views keep the buffer, and the buffer keeps the worker: all still valid.
    assert w_ref() is not None and w_ref().initialized
    assert ten[12345].item() == 12345 and arr[777] == 777 and mv[4242] == 4242
    assert int(ten.sum()) == sum(range(1 << 14))
    del ten, arr
    gc.collect()
    assert mv[1] == 1 and w_ref() is not None
    mv.release()
    del mv
    gc.collect()
    assert w_ref() is None  # last view gone: buffer and worker released (finalized)


def test_finalize_refuses_while_views_exist(worker):
    busy = worker.alloc_pinned_host(4096)
    idle = worker.alloc_pinned_host(4096)
    t1 = torch.from_dlpack(busy)
    t2 = torch.from_dlpack(busy)
    t1[0] = 11
    with pytest.raises(BufferError, match=r"1 pinned buffer\(s\) still have 2 live view\(s\)"):
        worker.finalize()
    # Refused: everything is still usable and nothing was released.
    assert worker.initialized and not busy.closed and not idle.closed
    assert t2[0].item() == 11 and worker.stats().pinned_count == 2
    del t1, t2
    worker.finalize()
    assert busy.closed and idle.closed and worker.finalized
    with pytest.raises(ValueError, match="closed"):
        memoryview(busy)
    with pytest.raises(ValueError, match="closed"):
        busy.__dlpack__()
    busy.close()  # release after finalize is harmless
    del busy, idle


def test_close_with_live_views_raises_and_keeps_memory(worker):
    b = worker.alloc_pinned_host(4096)
    mv = memoryview(b)
    arr = np.frombuffer(b, dtype=np.uint8)
    mv[3] = 33
    with pytest.raises(BufferError, match=r"2 live view\(s\)"):
        b.close()
    assert not b.closed and arr[3] == 33
    with pytest.raises(BufferError, match=r"2 live view\(s\)"):
        with b:
            pass
    mv.release()
    del arr
    b.close()
    assert b.closed and worker.stats().pinned_count == 0
    b.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        np.frombuffer(b, dtype=np.uint8)
    with b:  # a closed buffer's context manager is harmless
        pass


def test_buffer_context_manager_closes(worker):
    with worker.alloc_pinned_host(4096) as b:
        memoryview(b)[0] = 1
    assert b.closed and worker.stats().pinned_count == 0


# Everything that can hold the memory, deleted in every order.
_HOLDERS = ("worker", "buffer", "memoryview", "numpy", "torch")


@pytest.fixture(scope="module")
def frozen_gc():
    # Objects that exist now (torch's, pytest's) are left out of collections, so each
    # gc.collect() below only walks what the test made: 600 collections stay cheap.
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("order", list(itertools.permutations(_HOLDERS)))
def test_del_ordering_permutations(order, frozen_gc):
    objs = {"worker": pinstage.Worker()}
    objs["buffer"] = objs["worker"].alloc_pinned_host(4096)
    objs["memoryview"] = memoryview(objs["buffer"]).cast("i")
    objs["numpy"] = np.frombuffer(objs["buffer"], dtype=np.int32)
    objs["torch"] = torch.from_dlpack(objs["buffer"]).view(torch.int32)
    objs["torch"].copy_(torch.arange(1024, dtype=torch.int32))
    w_ref = weakref.ref(objs["worker"])
    for name in order:
        del objs[name]
        gc.collect()
        # Every view still alive reads the right values.
        if "memoryview" in objs:
            assert objs["memoryview"][1000] == 1000
        if "numpy" in objs:
            assert objs["numpy"][17] == 17
        if "torch" in objs:
            assert objs["torch"][512].item() == 512
        if any(name in objs for name in _HOLDERS):
            assert w_ref() is not None
    assert w_ref() is None


def test_no_leak_across_10000_alloc_free_cycles(worker):
    for i in range(10_000):
        b = worker.alloc_pinned_host(4096)
        if i % 3 == 0:
            mv = memoryview(b)
            mv[0] = 1
            mv.release()
        elif i % 3 == 1:
            t = torch.from_dlpack(b)
            t[0] = 1
            del t
        b.close() if i % 2 else None
        del b
    gc.collect()
    stats = worker.stats()
    assert (stats.pinned_count, stats.pinned_bytes) == (0, 0)
    assert worker.open_buffers == 0 and worker.live_views == 0


def test_release_failure_prints_to_stderr_and_nothing_escapes(capfd):
    import pinstage

    # No cache: each buffer's release is the backend's release, which the fault refuses.
    worker = pinstage.Worker(host_cache_limit_bytes=0)
    b = worker.alloc_pinned_host(4096)
    worker.inject_fault("host_free", 1)
    b.close()  # the C++ buffer logs the failure; close() itself does not raise
    err = capfd.readouterr().err
    assert "pinned host free failed" in err and "injected fault" in err
    assert b.closed

    b = worker.alloc_pinned_host(4096)
    worker.inject_fault("host_free", 1)
    del b  # from the destructor: a diagnostic, no exception
    gc.collect()
    err = capfd.readouterr().err
    assert "pinned host free failed" in err
    # Both are still the backend's memory: counted as failed frees, and finalize frees them.
    stats = worker.stats()
    assert (stats.failed_free_count, stats.failed_free_bytes) == (2, 8192)
    assert stats.free_failures == 2
    worker.finalize()
    assert "failed" not in capfd.readouterr().err


def test_buffer_reclaimed_by_finalize_then_deleted_is_harmless(worker, capfd):
    b = worker.alloc_pinned_host(4096)
    worker.finalize()
    assert b.closed
    del b
    gc.collect()
    assert "failed" not in capfd.readouterr().err


def test_interpreter_exit_with_everything_alive(build_dir):
    """Leaving workers, buffers, views, capsules and fixture args for interpreter shutdown
    neither crashes nor hangs, and prints no error."""
    import subprocess
    import sys
    script = (
        "import numpy as np, torch, pinstage\n"
        "w = pinstage.Worker()\n"
        "b = w.alloc_pinned_host(4096)\n"
        "mv, arr, t, cap = memoryview(b), np.frombuffer(b, np.uint8), torch.from_dlpack(b), "
        "b.__dlpack__()\n"
        "alloc = pinstage.PinnedTorchAllocator(w)\n"
        "x = alloc.zeros((4, 4))\n"
        "args = pinstage.TaskArgs(); args.add('x', x)\n"
        "view = args['x']\n"
        "binder = pinstage.Binder(w)\n"
        "orphan = torch.from_dlpack(pinstage.Worker().alloc_pinned_host(64))\n"
        "print('done')\n")
    env = {"PYTHONPATH": str(build_dir / "python"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert "error" not in proc.stderr.lower(), proc.stderr
