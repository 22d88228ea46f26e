"""Python defects of issue 14 (item 9, unclear errors) and checks that can fail: every bad
input gets a specific message (never pybind11's "Unable to cast"), NumPy integers work
where ints do, zero-element tensors read as pinned, and the lock is real (VmLck)."""
import gc

import numpy as np
import pytest
import torch

import pinstage
from pinstage import Binder, TaskArgs


def vm_locked_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmLck:"):
            return int(line.split()[1])
    raise AssertionError("no VmLck line in /proc/self/status")


@pytest.mark.parametrize("call, error, message", [
    (lambda: pinstage.Worker(plugin_path=1), TypeError,
     "plugin_path must be str or os.PathLike, not int"),
    (lambda: pinstage.Worker(config={1: "x"}), TypeError, "config: a key must be a str"),
    (lambda: pinstage.Worker(config={"k": [1]}), TypeError, r"config\['k'\] must be a str"),
    (lambda: pinstage.Worker(config=5), TypeError, "config must be a dict"),
    (lambda: pinstage.Worker(device_id="0"), pinstage.InvalidArgumentError,
     "device_id must be an int, got str"),
    (lambda: pinstage.scene_make_args("qwen3-decode", {1: 2}), TypeError,
     "parameter name must be a str"),
    (lambda: pinstage.scene_make_args("qwen3-decode", {"layers": "1"}),
     pinstage.InvalidArgumentError, "scene parameter layers must be an int, got str"),
    (lambda: pinstage.require_chip_worker(pinstage.Worker(), 3), TypeError,
     "who must be a str"),
])
def test_wrong_types_get_specific_errors(call, error, message):
    with pytest.raises(error, match=message) as e:
        call()
    assert "Unable to cast" not in str(e.value)


def test_bounds_in_messages_are_the_real_ones(worker):
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"copy_threads must be in \[0, 2147483647\], got 1099511627776"):
        Binder(worker, copy_threads=2**40)
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"staging_buffers = 2\*\*70 is out of range|staging_buffers = "
                             r"1180591620717411303424 is out of range \(int64"):
        Binder(worker, staging_buffers=2**70)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"nth must be >= 1, got 0"):
        worker.inject_fault("host_alloc", 0)


def test_sparse_tensor_is_refused_by_name():
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"'s' has layout torch.sparse_coo; dense \(torch.strided\)"):
        TaskArgs().add("s", torch.zeros(4).to_sparse())


@pytest.mark.parametrize("name", ["__metadata__", "a\0b", ""])
def test_reserved_and_nul_names_are_refused(name):
    args = TaskArgs()
    with pytest.raises(pinstage.InvalidArgumentError, match="is not allowed"):
        args.add(name, torch.zeros(4))
    assert len(args) == 0
    with pytest.raises(TypeError, match="name must be a str, got int"):
        args.add(1, torch.zeros(4))
    with pytest.raises(TypeError, match="direction must be a str"):
        args.add("x", torch.zeros(4), direction=1)


def test_finalize_of_a_never_initialized_worker_is_terminal():
    w = pinstage.Worker(initialize=False)
    w.finalize()
    assert w.finalized and not w.initialized and "finalized" in repr(w)
    with pytest.raises(pinstage.Error, match="finalize is terminal") as e:
        w.init()
    assert e.value.code == "finalized"
    with pytest.raises(pinstage.Error, match="finalize is terminal"):
        with w:
            pass
    with pytest.raises(pinstage.Error, match="finalized"):
        w.alloc_pinned_host(64)
    w.finalize()  # still idempotent


def test_numpy_integers_work_where_ints_do(worker, alloc):
    b = worker.alloc_pinned_host(np.int64(64))
    assert b.nbytes == 64
    assert alloc.empty(np.int32(3), np.int64(2)).shape == (3, 2)
    assert Binder(worker, copy_threads=np.int32(2), staging_buffers=np.uint8(2)) is not None
    assert pinstage.scene_describe("qwen3-decode", {"layers": np.int64(1)})
    worker.inject_fault("host_alloc", np.int16(5))
    with pytest.raises(pinstage.InvalidArgumentError, match="must be an int, got bool"):
        worker.alloc_pinned_host(True)


def test_zero_element_allocator_tensor_reads_as_pinned(worker, alloc):
    t = alloc.empty((0, 16), dtype=torch.bfloat16)
    assert t.numel() == 0 and t.data_ptr() == 0  # torch reports no address at all
    assert worker.stats().pinned_count == 1  # ... yet it has its pinned buffer
    assert alloc.is_pinned(t) and pinstage.is_pinned(t)
    assert not pinstage.is_pinned(torch.empty(0))


def test_pinned_memory_is_really_locked(worker):
    """VmLck (the kernel's count of this process's mlock'ed memory), not the flag."""
    if not worker.capabilities.pinned_is_page_locked:
        pytest.skip("mlock refused here (RLIMIT_MEMLOCK)")
    size = 2 << 20  # within the usual 8 MiB RLIMIT_MEMLOCK
    before = vm_locked_kib()
    b = worker.alloc_pinned_host(size)
    assert vm_locked_kib() - before >= size // 1024
    b.close()
    # Freed into the pool's cache: still locked, for reuse, until empty_cache().
    assert vm_locked_kib() - before >= size // 1024
    assert worker.host_memory_stats()["cached_bytes.current"] >= size
    assert worker.empty_cache() >= size
    assert vm_locked_kib() - before < size // 1024
    t = pinstage.PinnedTorchAllocator(worker).ones(size // 4)
    assert vm_locked_kib() - before >= size // 1024
    del t
    gc.collect()
    worker.empty_cache()
    assert vm_locked_kib() - before < size // 1024


def test_host_memory_stats_and_empty_cache(worker):
    """The pool's figures under torch's names, a reuse that maps nothing, and the give-back."""
    keys = {"allocated_bytes.current", "allocated_bytes.peak", "allocation.current",
            "allocation.peak", "reserved_bytes.current", "reserved_bytes.peak",
            "segment.current", "segment.peak", "num_host_alloc", "num_host_free",
            "host_alloc_time.total", "host_free_time.total", "cached_bytes.current",
            "pending_bytes.current", "pending_blocks.current", "num_hits", "num_misses",
            "alloc_time.total", "free_time.total", "cache_limit_bytes"}
    b = worker.alloc_pinned_host(1000)
    s = worker.host_memory_stats()
    assert set(s) == keys
    assert (s["allocated_bytes.current"], s["allocation.current"], s["num_misses"]) == (1000, 1, 1)
    b.close()
    c = worker.alloc_pinned_host(1000)
    s = worker.host_memory_stats()
    assert (s["num_hits"], s["num_host_alloc"], s["segment.current"]) == (1, 1, 1)
    c.close()
    assert worker.empty_cache() == s["reserved_bytes.current"]
    s = worker.host_memory_stats()
    assert (s["reserved_bytes.current"], s["segment.current"], s["num_host_free"]) == (0, 0, 1)
    assert s["allocated_bytes.peak"] == 1000
