"""Races and exits that used to crash or mix up the registry (issue 14, defects 1-3).

The in-flight checks are deterministic: a GIL-release hook (_set_gil_release_hook, a test
hook of the extension) holds the call's thread on a latch inside its first GIL-free
window, the main thread acts there, and the test checks what the code recorded (the busy
count, the refusal naming the call) before letting the call finish."""
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import pinstage
from pinstage import _pinstage, qwen3


def while_running(call, action):
    """Starts call() on a thread and holds it inside its first GIL-free window (right after
    its C++ part released the GIL); runs action() there, then lets call() finish. Returns
    (action's result or exception, call's result or exception, whether call() was held)."""
    held, resume = threading.Event(), threading.Event()
    outcome = {}

    def hook():
        if threading.current_thread() is thread and not held.is_set():
            outcome["held"] = True
            held.set()
            resume.wait()

    def run():
        try:
            outcome["call"] = call()
        except Exception as e:  # noqa: BLE001 - returned to the test
            outcome["call"] = e
        finally:
            held.set()  # a call that never released the GIL wakes the test all the same

    thread = threading.Thread(target=run)
    _pinstage._set_gil_release_hook(hook)
    try:
        thread.start()
        held.wait()
        try:
            result = action()
        except Exception as e:  # noqa: BLE001 - returned to the test
            result = e
    finally:
        resume.set()
        thread.join()
        _pinstage._set_gil_release_hook(None)
    return result, outcome["call"], outcome.get("held", False)


def test_finalize_refuses_while_make_args_writes_pinned_memory():
    w = pinstage.Worker()
    busy = []
    refused, args, held = while_running(lambda: qwen3.make_args(layers=1, seq_len=64, worker=w),
                                        lambda: (busy.append(w.busy_calls), w.finalize()))
    assert held and busy == [1]  # held while generating, and counted busy
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
    seen = []
    refused, buffer, held = while_running(
        lambda: w.alloc_pinned_host(64 << 20),
        lambda: (seen.append((w.busy_calls, w.open_buffers)), w.finalize()))
    # Held while pinning: counted busy, the buffer not registered yet (what finalize would
    # have reclaimed under it).
    assert held and seen == [(1, 0)]
    assert isinstance(refused, BufferError), refused
    assert "1 call(s) on other threads" in str(refused)
    assert isinstance(buffer, pinstage.PinnedHostBuffer) and not buffer.closed
    t = torch.from_dlpack(buffer)
    t[-1] = 5  # the memory is live
    assert pinstage.PinnedTorchAllocator(w).is_pinned(t)
    del t
    w.finalize()
    assert buffer.closed


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_close_is_refused_while_a_checkpoint_read_writes_the_buffer(worker, tmp_path, direct):
    """read_into writes into the buffers without the GIL: it holds each one for the whole
    read, so close() there is refused naming the read (it used to release the memory under
    the read: EFAULT, or a segfault with direct=True)."""
    from test_py_checkpoint import raw, write_file
    x = torch.arange(1 << 14, dtype=torch.float32)
    path = tmp_path / "m.safetensors"
    write_file(path, {"x": x})
    checkpoint = _pinstage._Checkpoint(str(path))
    buffer = worker.alloc_pinned_host(x.numel() * 4)
    seen = []

    def close_and_finalize():
        seen.append(buffer.live_views)
        with pytest.raises(BufferError) as finalize_refused:
            worker.finalize()
        seen.append(str(finalize_refused.value))
        buffer.close()

    refused, report, held = while_running(
        lambda: checkpoint.read_into(["x"], [buffer], threads=1, direct=direct),
        close_and_finalize)
    assert held and seen[0] == 1  # held inside the read, which holds the buffer
    assert isinstance(refused, BufferError), refused
    assert "1 of them held by a running checkpoint read (read_into)" in str(refused)
    assert "1 view(s), 1 of them held by a running checkpoint read" in seen[1]
    assert isinstance(report, dict) and report["bytes"] == x.numel() * 4, report
    assert not buffer.closed and buffer.live_views == 0
    assert bytes(memoryview(buffer)) == raw(x)  # the read finished into live memory
    buffer.close()
    assert buffer.closed


EXIT_SCRIPT = textwrap.dedent("""
    import threading, numpy, torch, pinstage
    w = pinstage.Worker()
    alloc = pinstage.PinnedTorchAllocator(w)
    args = pinstage.TaskArgs()
    args.add("x", alloc.ones(1 << 16, dtype=torch.float32), "inout")
    binder = pinstage.Binder(w)
    started = threading.Barrier(9)
    looped = threading.Barrier(9)  # passed once every thread has done a whole round

    def churn():
        started.wait()
        first = True
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
            if first:
                first = False
                looped.wait()

    def bind():
        started.wait()
        binder.run(args)
        looped.wait()
        while True:
            binder.run(args)

    for target in (churn,) * 7 + (bind,):
        threading.Thread(target=target, daemon=True).start()
    started.wait()
    looped.wait()
    # Exit only with calls in flight without the GIL, as the worker counts them: their
    # threads take the GIL back while the interpreter finalizes.
    in_flight = 0
    while in_flight == 0:
        in_flight = w.busy_calls
    print(f"exiting with {in_flight} call(s) in flight", flush=True)
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
        assert re.fullmatch(r"exiting with [1-9][0-9]* call\(s\) in flight", out.strip()), out
