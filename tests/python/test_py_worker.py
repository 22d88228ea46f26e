"""pinstage.Worker from Python: lifecycle, options, errors with the C++ code and message."""
import gc

import pytest

import pinstage


def test_worker_defaults_initialize_a_sim_chip_worker():
    w = pinstage.Worker()
    try:
        assert w.initialized and not w.finalized
        assert (w.level, w.backend, w.device_id) == ("chip", "sim", 0)
        assert w.backend_path.endswith("libpinstage_backend_sim.so")
        assert w.capabilities.execute and w.capabilities.device_memory_is_host
        assert "device_memory_is_host=True" in repr(w.capabilities)
        stats = w.stats()
        assert stats.pinned_count == 0 and stats.pinned_bytes == 0
        assert "initialized" in repr(w)
    finally:
        w.finalize()
    assert w.finalized and not w.initialized
    assert "finalized" in repr(w)


def test_init_and_finalize_follow_the_cpp_semantics():
    w = pinstage.Worker(initialize=False)
    assert not w.initialized and not w.finalized
    with pytest.raises(pinstage.Error) as e:
        w.stats()
    assert e.value.code == "not_initialized"
    assert "call init(backend, device_id) first" in str(e.value)
    w.init()
    assert w.initialized
    with pytest.raises(pinstage.InvalidArgumentError, match="already initialized"):
        w.init()
    w.finalize()
    w.finalize()  # idempotent
    with pytest.raises(pinstage.Error) as e:
        w.alloc_pinned_host(16)
    assert e.value.code == "finalized"
    assert "create and init a new Worker" in str(e.value)
    with pytest.raises(pinstage.Error) as e:
        w.init()
    assert e.value.code == "finalized"


def test_context_manager_inits_and_finalizes():
    with pinstage.Worker(initialize=False) as w:
        assert w.initialized
        b = w.alloc_pinned_host(64)
    assert w.finalized
    assert b.closed


def test_context_manager_exit_refuses_with_live_views_and_keeps_them_valid():
    with pytest.raises(BufferError, match="1 live view"):
        with pinstage.Worker() as w:
            b = w.alloc_pinned_host(64)
            view = memoryview(b)
            view[0] = 42
    assert w.initialized  # refused: nothing was released
    assert view[0] == 42
    view.release()
    w.finalize()


def test_context_manager_does_not_hide_the_body_exception():
    with pytest.raises(KeyError):
        with pinstage.Worker() as w:
            view = memoryview(w.alloc_pinned_host(64))
            raise KeyError("body")
    assert w.initialized and view[0] == 0  # left alive for its views
    view.release()
    w.finalize()


def test_errors_carry_code_and_cpp_message():
    with pytest.raises(pinstage.Error) as e:
        pinstage.Worker(backend="nope")
    assert e.value.code == "plugin_load"
    assert "nope" in str(e.value) and "libpinstage_backend_nope.so" in str(e.value)
    assert isinstance(e.value, RuntimeError)

    with pytest.raises(pinstage.InvalidArgumentError) as e:
        pinstage.Worker(backend="Bad Name")
    assert e.value.code == "invalid_argument"
    assert isinstance(e.value, ValueError) and isinstance(e.value, pinstage.Error)

    with pytest.raises(pinstage.InvalidArgumentError, match="device id must be >= 0"):
        pinstage.Worker(device_id=-1)
    with pytest.raises(pinstage.InvalidArgumentError, match="unknown worker level 'rack'"):
        pinstage.Worker(level="rack")
    with pytest.raises(pinstage.InvalidArgumentError, match="not level node: the node level"):
        pinstage.Worker(level="node")


def test_error_code_names_cover_every_code():
    names = pinstage.error_code_names()
    assert names[0] == "invalid_argument"
    assert {"out_of_memory", "finalized", "plugin_load", "mismatch"} <= set(names)


def test_options_reach_the_backend():
    w = pinstage.Worker(device_capacity_bytes=1 << 20, config={})
    try:
        assert w.stats().device_capacity_bytes == 1 << 20
    finally:
        w.finalize()
    with pytest.raises(TypeError, match="unexpected option 'capacity'"):
        pinstage.Worker(capacity=1)
    with pytest.raises(pinstage.InvalidArgumentError, match="device_capacity_bytes must be >= 0"):
        pinstage.Worker(device_capacity_bytes=-1)
    with pytest.raises(pinstage.InvalidArgumentError, match="must be an int"):
        pinstage.Worker(device_capacity_bytes="1G")
    w = pinstage.Worker(host_cache_limit_bytes=1 << 20)
    try:
        assert w.host_memory_stats()["cache_limit_bytes"] == 1 << 20
    finally:
        w.finalize()
    with pytest.raises(pinstage.InvalidArgumentError, match="host_cache_limit_bytes must be >= 0"):
        pinstage.Worker(host_cache_limit_bytes=-1)
    with pytest.raises(pinstage.Error) as e:
        pinstage.Worker(plugin_path="/nonexistent/libpinstage_backend_sim.so")
    assert e.value.code == "plugin_load"


def test_alloc_pinned_host_validates_nbytes():
    w = pinstage.Worker()
    try:
        for bad in (0, -5):
            with pytest.raises(pinstage.InvalidArgumentError, match="nbytes must be >= 1"):
                w.alloc_pinned_host(bad)
        for bad in (1.5, "16", True):
            with pytest.raises(pinstage.InvalidArgumentError, match="must be an int"):
                w.alloc_pinned_host(bad)
        with pytest.raises(pinstage.InvalidArgumentError, match="out of range"):
            w.alloc_pinned_host(1 << 70)
        with pytest.raises(pinstage.InvalidArgumentError, match="physical memory"):
            w.alloc_pinned_host(1 << 60)
        assert w.stats().pinned_count == 0
    finally:
        w.finalize()


def test_inject_fault_validates_the_kind():
    w = pinstage.Worker()
    try:
        with pytest.raises(pinstage.InvalidArgumentError, match="unknown fault kind 'boom'"):
            w.inject_fault("boom", 1)
        w.inject_fault("host_alloc", 1)
        with pytest.raises(pinstage.Error) as e:
            w.alloc_pinned_host(64)
        assert e.value.code == "injected_fault"
        assert w.stats().pinned_count == 0
        assert not w.alloc_pinned_host(64).closed  # only the first call failed
    finally:
        gc.collect()
        w.finalize()
