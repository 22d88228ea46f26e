"""Long C++ calls release the GIL: a Python thread makes progress while they run.

The check is deterministic, not timed: the switch interval is raised to 100 s, so the
interpreter never takes the GIL away from the calling thread on its own. A probe thread
that is waiting for the GIL can then only run while the call has released it, and it
records which phase the main thread was in when it ran."""
import gc
import sys
import threading

import pytest

import pinstage
from pinstage import qwen3


def ran_during(call):
    """Runs call() and tells in which phase a waiting Python thread got to run."""
    phase = ["before"]
    seen = []
    go = threading.Event()

    def probe():
        go.wait()
        seen.append(phase[0])

    thread = threading.Thread(target=probe)
    thread.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        go.set()  # the probe now waits for the GIL
        phase[0] = "during"
        call()
        phase[0] = "after"
    finally:
        sys.setswitchinterval(old)
        thread.join()
    return seen[0]


@pytest.fixture(scope="module")
def env():
    w = pinstage.Worker()
    args = qwen3.make_args(layers=1, seq_len=64)
    yield w, args
    del args
    gc.collect()
    w.finalize()


def test_probe_detects_a_call_that_holds_the_gil():
    # A pure-Python busy loop never lets the probe in: the check can fail.
    assert ran_during(lambda: sum(range(2_000_000))) == "after"


def test_fixture_generation_releases_the_gil(env):
    assert ran_during(lambda: qwen3.make_args(layers=1, seq_len=64)) == "during"


def test_pinned_fixture_generation_releases_the_gil(env):
    w, _ = env
    assert ran_during(lambda: qwen3.make_args(layers=1, seq_len=64, worker=w)) == "during"


def test_golden_releases_the_gil(env):
    _, args = env
    assert ran_during(lambda: qwen3.compute_golden(args, 1)) == "during"


def test_bind_releases_the_gil(env):
    # Upload only: the decode kernels after it run in the same GIL-free call, and
    # test_scene_rounds_release_the_gil runs them (under TSan they took 50 s more here).
    w, args = env
    binder = pinstage.Binder(w)
    assert ran_during(lambda: binder.run(args)) == "during"


def test_pinned_allocation_releases_the_gil(env):
    w, _ = env
    assert ran_during(lambda: w.alloc_pinned_host(512 << 20).close()) == "during"


def test_finalize_refuses_while_another_thread_reads_pinned_memory(env):
    """A bind running without the GIL on another thread makes finalize() refuse."""
    w, args = env
    binder = pinstage.Binder(w)
    entered = threading.Event()
    errors = []

    def bind():
        entered.set()  # with the long switch interval, this thread keeps the GIL until
        try:           # run() releases it, so the main thread wakes inside run()
            binder.run(args)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    thread = threading.Thread(target=bind)
    try:
        thread.start()
        entered.wait()
        with pytest.raises(BufferError, match=r"1 call\(s\) on other threads"):
            w.finalize()
    finally:
        sys.setswitchinterval(old)
        thread.join()
    assert not errors and w.initialized


def test_scene_rounds_release_the_gil(env):
    w, _ = env
    reports = []
    assert ran_during(lambda: reports.append(
        qwen3.run_scene(w, layers=1, seq_len=64, storage="pinned", rounds=1))) == "during"
    report = reports[0]
    assert report.ok and report.storage == "pinned" and len(report.rounds) == 1
    assert report.rounds[0].comparison.ok and report.rounds[0].bind.executed
    assert w.stats().pinned_count == 0  # the run gave its pinned args back
