"""Races and exits that used to crash or mix up the registry (issue 14, defects 1-3).

The in-flight checks are deterministic, as in test_py_gil.py: with the switch interval at
100 s a thread keeps the GIL until a C++ call releases it, so the main thread wakes only
while the other thread's call is running without the GIL."""
import gc
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import pinstage
from pinstage import qwen3


def while_running(call, action):
    """Starts call() on a thread; runs action() while call has the GIL released. Returns
    (action's result or exception, call's result or exception)."""
    entered = threading.Event()
    outcome = {}

    def run():
        entered.set()
        try:
            outcome["call"] = call()
        except Exception as e:  # noqa: BLE001 - returned to the test
            outcome["call"] = e

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    thread = threading.Thread(target=run)
    try:
        thread.start()
        entered.wait()  # woken only when call() released the GIL
        try:
            result = action()
        except Exception as e:  # noqa: BLE001 - returned to the test
            result = e
    finally:
        sys.setswitchinterval(old)
        thread.join()
    return result, outcome["call"]


def test_finalize_refuses_while_make_args_writes_pinned_memory():
    w = pinstage.Worker()
    refused, args = while_running(lambda: qwen3.make_args(layers=1, seq_len=64, worker=w),
                                  w.finalize)
    assert isinstance(refused, BufferError), refused
    assert "1 call(s) on other threads" in str(refused)
    # The generator finished into live memory, and the args are usable.
    assert isinstance(args, pinstage.TaskArgs) and w.initialized
    assert args.describe()[0]["pinned"] and float(args.wq.float().abs().sum()) > 0
    del args
    gc.collect()
    w.finalize()


def test_finalize_refuses_while_alloc_pins():
    """alloc_pinned_host and finalize are atomic with respect to each other: a buffer can
    never be registered over memory that finalize reclaimed."""
    w = pinstage.Worker()
    refused, buffer = while_running(lambda: w.alloc_pinned_host(64 << 20), w.finalize)
    assert isinstance(refused, BufferError), refused
    assert "1 call(s) on other threads" in str(refused)
    assert isinstance(buffer, pinstage.PinnedHostBuffer) and not buffer.closed
    t = torch.from_dlpack(buffer)
    t[-1] = 5  # the memory is live
    assert pinstage.PinnedTorchAllocator(w).is_pinned(t)
    del t
    w.finalize()
    assert buffer.closed


EXIT_SCRIPT = textwrap.dedent("""
    import threading, time, numpy, torch, pinstage
    w = pinstage.Worker()
    alloc = pinstage.PinnedTorchAllocator(w)
    args = pinstage.TaskArgs()
    args.add("x", alloc.ones(1 << 16, dtype=torch.float32), "inout")
    binder = pinstage.Binder(w)
    started = threading.Barrier(9)

    def churn():
        started.wait()
        while True:
            # No torch ops in these threads: torch 1.13's own ops (setitem, zeros,
            # from_dlpack) release the GIL in noexcept frames and abort at exit by
            # themselves (seen in core dumps), whatever pinstage does.
            b = w.alloc_pinned_host(1 << 20)
            a = numpy.asarray(b)  # a counted buffer-protocol view
            a[0] = 1
            del a
            b.close()
            del b
            b = w.alloc_pinned_host(4096)  # freed by its destructor, not close()
            del b

    def bind():
        started.wait()
        while True:
            binder.run(args)

    for target in (churn,) * 7 + (bind,):
        threading.Thread(target=target, daemon=True).start()
    started.wait()
    time.sleep(0.5)  # every thread is churning, most of them without the GIL
    print("exiting", flush=True)
""")


def test_interpreter_exit_with_daemon_threads_allocating(build_dir):
    """Exits while daemon threads allocate, free and bind: before the fix every run
    aborted with "terminate called without an active exception" (the GIL taken back in a
    noexcept destructor by a thread that finalization ends with a forced unwind)."""
    env = dict(os.environ, PYTHONPATH=str(build_dir / "python"))
    procs = [subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert "terminate called" not in err, err
        assert proc.returncode == 0, err
        assert out.strip() == "exiting"
