"""load_file(into=...) and safe_open(...).get_tensor(name, out=...): checkpoints read into
pinned tensors the caller already holds, checked before any byte is written; the bytes
compared with the hand-written reference parser of test_py_checkpoint.py. Then names= and
device= (which tensors, and onto the worker's device)."""
import gc

import pytest
import torch

import pinstage
from test_py_checkpoint import raw, reference_parse, write_file


def sample():
    g = torch.Generator().manual_seed(11)
    return {
        "embed": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "norm": torch.randn(32, generator=g),
        "ids": torch.randint(-100, 100, (7, 3), generator=g),
        "mask": torch.rand(9, generator=g) > 0.5,
        "empty": torch.zeros(0, 4),
    }


def pinned_like(alloc, ref):
    """{name: pinned tensor of the same dtype and shape, filled with a sentinel}."""
    out = {}
    for name, t in ref.items():
        p = alloc.empty(tuple(t.shape), dtype=t.dtype)
        p.view(torch.uint8).fill_(0xA5) if p.numel() else None
        out[name] = p
    return out


def pool_requests(worker):
    """Every pinned request the worker's host memory pool has served or mapped."""
    s = worker.host_memory_stats()
    return s["num_hits"] + s["num_misses"], s["num_host_alloc"], s["allocation.current"]


def test_a_torch_users_loop_loads_twice_into_the_same_pinned_tensors(worker, alloc, tmp_path):
    first, second = tmp_path / "step1.safetensors", tmp_path / "step2.safetensors"
    write_file(first, sample())
    write_file(second, {n: (t + 1 if t.dtype != torch.bool else ~t) for n, t in sample().items()})
    ref1, _ = reference_parse(first)
    ref2, _ = reference_parse(second)
    tensors = pinned_like(alloc, ref1)
    pinned = (worker.stats().pinned_count, worker.stats().pinned_bytes)

    got = pinstage.load_file(first, worker=worker, into=tensors)
    assert list(got) == list(ref1)  # checkpoint order
    for name in ref1:
        assert got[name] is tensors[name]  # the caller's tensors, not copies
        assert raw(tensors[name]) == raw(ref1[name]), name
    # The second load: no pinned allocation at all (no pool request, no new segment).
    before = pool_requests(worker)
    got = pinstage.load_file(second, worker=worker, into=tensors, threads=2, chunk_bytes=7)
    assert pool_requests(worker) == before
    assert (worker.stats().pinned_count, worker.stats().pinned_bytes) == pinned
    for name in ref2:
        assert got[name] is tensors[name]
        assert raw(tensors[name]) == raw(ref2[name]), name
        assert pinstage.is_pinned(tensors[name]) or tensors[name].numel() == 0
    # Then a non-blocking upload of every tensor and one event wait: the copies run on the
    # worker's one copy stream in order, so the last event covers them all.
    device, events = {}, []
    for name, t in tensors.items():
        device[name] = worker.alloc_device(max(t.numel() * t.element_size(), 1))
        events.append(worker.copy_to_device_async(device[name], t))
    events[-1].wait()
    assert all(e.query() for e in events)
    # What arrived, read back through pinned memory, is the independent reader's bytes.
    for name, t in tensors.items():
        back = alloc.empty_like(t)
        worker.copy_to_host_async(back, device[name]).wait()
        assert raw(back) == raw(ref2[name]), name


def test_get_tensor_out_reads_into_the_given_tensor(worker, alloc, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    out = alloc.zeros(64, 32, dtype=torch.bfloat16)
    before = pool_requests(worker)
    with pinstage.safe_open(path, worker=worker) as f:
        assert f.get_tensor("embed", out=out) is out
    assert pool_requests(worker) == before
    assert raw(out) == raw(ref["embed"])
    # A slice of a bigger pinned tensor is pinned memory too: rows 2..3 of a [4, 32] f32.
    big = alloc.zeros(4, 32)
    with pinstage.safe_open(path, worker=worker) as f:
        f.get_tensor("norm", out=big[2])
    assert raw(big[2]) == raw(ref["norm"]) and not big[[0, 1, 3]].any()
    # A wrong `out` is refused before anything is read, naming get_tensor.
    wrong = alloc.zeros(3)
    with pinstage.safe_open(path, worker=worker) as f:
        with pytest.raises(pinstage.InvalidArgumentError,
                           match=r"safe_open.get_tensor\(out=\): tensor 'norm' is float32 of "
                                 r"shape \(32,\) in the checkpoint \(F32\), but the tensor "
                                 r"given for it is float32 of shape \(3,\)"):
            f.get_tensor("norm", out=wrong)
    assert not wrong.any()


def untouched(tensors):
    return all(not t.numel() or bool((t.view(torch.uint8) == 0xA5).all())
               for t in tensors.values())


@pytest.mark.parametrize("replace, error, message", [
    (lambda a: a.zeros(64, 32), pinstage.InvalidArgumentError,
     r"load_file\(into=\): tensor 'embed' is bfloat16 of shape \(64, 32\) in the checkpoint "
     r"\(BF16\), but the tensor given for it is float32 of shape \(64, 32\)"),
    (lambda a: a.zeros(32, 64, dtype=torch.bfloat16), pinstage.InvalidArgumentError,
     r"tensor 'embed' is bfloat16 of shape \(64, 32\) .* given for it is bfloat16 of shape "
     r"\(32, 64\)"),
    (lambda a: a.zeros(32, 64, dtype=torch.bfloat16).t(), pinstage.InvalidArgumentError,
     r"the tensor for 'embed' is not contiguous \(strides \(1, 64\)\)"),
    (lambda a: torch.zeros(64, 32, dtype=torch.bfloat16), pinstage.InvalidArgumentError,
     r"the memory for tensor 'embed' \(4096 bytes\) is not inside one open pinned buffer of "
     r"this worker \(pageable, closed, or too small\)"),
    (lambda a: "not a tensor", TypeError,
     r"load_file\(into=\): the tensor for 'embed' must be a torch.Tensor, not str"),
])
def test_a_bad_tensor_is_refused_before_any_byte_is_written(worker, alloc, tmp_path, replace,
                                                            error, message):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    tensors = pinned_like(alloc, ref)
    tensors["embed"] = replace(alloc)
    kept = {n: t for n, t in tensors.items() if n != "embed"}
    with pytest.raises(error, match=message):
        pinstage.load_file(path, worker=worker, into=tensors)
    assert untouched(kept)  # 'norm', 'ids', ... come after 'embed' and before: none written


def test_another_workers_memory_and_overlaps_are_refused(worker, alloc, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    other = pinstage.Worker()
    tensors = pinned_like(alloc, ref)
    tensors["norm"] = pinstage.PinnedTorchAllocator(other).empty(32)
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"tensor 'norm' \(128 bytes\) is not inside one open pinned "
                             r"buffer of this worker \(it is another worker's pinned memory\)"):
        pinstage.load_file(path, worker=worker, into=tensors)
    del tensors["norm"]
    gc.collect()
    other.finalize()
    # Two names on one memory: the parallel reads would race; refused.
    both = alloc.zeros(64)
    write_file(tmp_path / "two.safetensors", {"norm": torch.ones(32), "x": torch.ones(32)})
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"the memory for tensors 'norm' and 'x' overlaps"):
        pinstage.load_file(tmp_path / "two.safetensors", worker=worker,
                           into={"norm": both[:32], "x": both[16:48]})
    assert not both.any()


def test_into_itself_is_checked(worker, alloc, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.ones(2)})
    with pytest.raises(TypeError, match=r"into must be a mapping of tensor name to "
                                        r"torch.Tensor, not list"):
        pinstage.load_file(path, worker=worker, into=[alloc.zeros(2)])
    with pytest.raises(TypeError, match=r"the keys of into must be str, not int"):
        pinstage.load_file(path, worker=worker, into={0: alloc.zeros(2)})
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"into names 1 tensor\(s\) the checkpoint does not hold "
                             r"\(the first is 'b'\)"):
        pinstage.load_file(path, worker=worker, into={"a": alloc.zeros(2), "b": alloc.zeros(2)})
    # A subset is fine: only 'a' is read (here the only one), and {} reads nothing.
    assert pinstage.load_file(path, worker=worker, into={}) == {}


def test_the_read_holds_the_tensors_buffers(worker, alloc, tmp_path):
    """While the read runs without the GIL, the buffers under `into` are leased: closing
    one, or finalizing the worker, is refused."""
    import threading

    from pinstage import _pinstage
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.arange(1000, dtype=torch.float32)})
    t = alloc.zeros(1000)
    inside, release = threading.Event(), threading.Event()

    def hook():
        if threading.current_thread() is not threading.main_thread():
            inside.set()
            release.wait()

    result = {}

    def load():
        result["got"] = pinstage.load_file(path, worker=worker, into={"a": t})

    _pinstage._set_gil_release_hook(hook)
    try:
        th = threading.Thread(target=load)
        th.start()
        assert inside.wait(60)
        with pytest.raises(BufferError, match="running checkpoint read"):
            worker.finalize()
        release.set()
        th.join(60)
    finally:
        _pinstage._set_gil_release_hook(None)
        release.set()
    assert torch.equal(result["got"]["a"], torch.arange(1000, dtype=torch.float32))


# ---- names= and device= (item 2) ----

def test_names_select_tensors_as_a_list_or_a_predicate(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    got = pinstage.load_file(path, worker=worker, names=["ids", "embed"])
    assert list(got) == ["embed", "ids"]  # checkpoint order, whatever the list's
    assert all(raw(got[n]) == raw(ref[n]) for n in got)
    assert worker.stats().pinned_count == 2  # nothing taken for the others
    got = pinstage.load_file(path, worker=worker, names=lambda n: n.startswith(("m", "n")))
    assert list(got) == ["norm", "mask"] and raw(got["mask"]) == raw(ref["mask"])
    assert pinstage.load_file(path, worker=worker, names=[]) == {}
    dev = pinstage.load_to_device(path, worker=worker, names=("norm", "ids"))
    assert dev.keys() == ["norm", "ids"]
    assert dev.report["tensors"] == 2
    assert dev.report["bytes"] == len(raw(ref["norm"])) + len(raw(ref["ids"]))
    assert dev.to_bytes("ids") == raw(ref["ids"])
    dev.close()


@pytest.mark.parametrize("names, error, message", [
    ("embed", TypeError, r"load_file\(\): names must be a list of tensor names or a "
                         r"callable name -> bool, not str"),
    (5, TypeError, r"names must be a list of tensor names or a callable name -> bool, not int"),
    ([b"embed"], TypeError, r"load_file\(\): names must hold str, not bytes"),
    (["embed", "nope", "nah"], pinstage.InvalidArgumentError,
     r"load_file\(\): names lists 2 tensor\(s\) the checkpoint does not hold \(the first is "
     r"'nope'\)"),
    (["ids", "ids"], pinstage.InvalidArgumentError, r"load_file\(\): names lists 'ids' twice"),
    (lambda n: 1, TypeError, r"load_file\(\): names\('embed'\) must return bool, not int"),
])
def test_bad_names_are_refused_before_anything_is_taken(worker, tmp_path, names, error,
                                                        message):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    with pytest.raises(error, match=message):
        pinstage.load_file(path, worker=worker, names=names)
    with pytest.raises(error, match=message.replace("load_file", "load_to_device")):
        pinstage.load_to_device(path, worker=worker, names=names)
    assert worker.stats().pinned_count == 0 and worker.stats().device_count == 0


def test_device_loads_onto_the_workers_device(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    for device in ("sim:0", "sim"):
        # 'ids' lies between them in the file: a ring piece must skip its bytes.
        dev = pinstage.load_file(path, worker=worker, device=device, names=["mask", "norm"],
                                 ring_bytes=1 << 12)
        assert dev.keys() == ["norm", "mask"]
        assert dev.to_bytes("norm") == raw(ref["norm"])
        assert dev.to_bytes("mask") == raw(ref["mask"])
        assert dev.report["ring_pinned_bytes"] == 1 << 12
        dev.close()
    assert worker.stats().pinned_count == 0  # the ring went with the load
    host = pinstage.load_file(path, worker=worker, device=torch.device("cpu"), names=["ids"])
    assert raw(host["ids"]) == raw(ref["ids"])


@pytest.mark.parametrize("device, error, message", [
    ("gpu:0", pinstage.InvalidArgumentError,
     r"load_file\(\): device 'gpu:0' is not a device: 'cpu', or TYPE\[:INDEX\] with TYPE one "
     r"of " + ", ".join(b.name for b in pinstage.backends()) + r" \(e.g. 'cuda:1'\)"),
    ("cuda:x", pinstage.InvalidArgumentError, r"device 'cuda:x' is not a device"),
    ("cuda:-1", pinstage.InvalidArgumentError, r"device 'cuda:-1' is not a device"),
    ("cuda:", pinstage.InvalidArgumentError, r"device 'cuda:' is not a device"),
    ("", pinstage.InvalidArgumentError, r"device '' is not a device"),
    ("acl:1", pinstage.InvalidArgumentError,  # acl is built everywhere, cuda only with CUDA
     r"load_file\(\): device 'acl:1' is backend 'acl' device 1, but the worker is backend "
     r"'sim' device 0; pass a Worker\(backend='acl', device_id=1\)"),
    ("acl:0", pinstage.InvalidArgumentError, r"device 'acl:0' is backend 'acl' device 0"),
    ("npu:0", pinstage.InvalidArgumentError,
     r"device 'npu:0' is not a device: pinstage's backend for Ascend NPUs is 'acl' "
     r"\(torch_npu's 'npu' is not a pinstage name\): pass device='acl:0'"),
    ("sim:1", pinstage.InvalidArgumentError, r"device 'sim:1' is backend 'sim' device 1"),
    (0, TypeError, r"load_file\(\): device must be str or torch.device, not int"),
])
def test_a_bad_device_is_refused(worker, tmp_path, device, error, message):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    with pytest.raises(error, match=message):
        pinstage.load_file(path, worker=worker, device=device)
    assert worker.stats().pinned_count == 0 and worker.stats().device_count == 0


def test_into_does_not_combine_with_names_or_a_device(worker, alloc, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.ones(2)})
    into = {"a": alloc.zeros(2)}
    with pytest.raises(pinstage.InvalidArgumentError, match=r"pass names= or into=, not both"):
        pinstage.load_file(path, worker=worker, into=into, names=["a"])
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"into= is host memory, but device='sim:0'"):
        pinstage.load_file(path, worker=worker, into=into, device="sim:0")
    assert not into["a"].any()


# ---- progress= (item 5) ----

class Stop(Exception):
    pass


def test_progress_sees_done_bytes_increase_to_the_total(worker, alloc, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    total = sum(len(raw(t)) for t in ref.values())
    # A device load reads a ring buffer (here 1 KiB) per call, a host load a chunk.
    for kwargs, calls_at_least in (({}, total // 100), ({"into": pinned_like(alloc, ref)},
                                   total // 100), ({"device": "sim:0"}, total // 1024)):
        calls = []
        got = pinstage.load_file(path, worker=worker, threads=3, chunk_bytes=100,
                                 ring_bytes=4096, progress=lambda d, t: calls.append((d, t)),
                                 **kwargs)
        assert all(t == total for _, t in calls)
        done = [d for d, _ in calls]
        assert done == sorted(done) and done[-1] == total and len(set(done)) == len(done)
        assert len(calls) >= calls_at_least, kwargs
        del got
    calls = []
    dev = pinstage.load_to_device(path, worker=worker, names=["norm"], progress=lambda d, t:
                                  calls.append((d, t)))
    assert calls[-1] == (128, 128)
    dev.close()


@pytest.mark.parametrize("target", ["host", "into", "device"])
def test_an_exception_in_progress_stops_the_load_and_leaks_nothing(worker, alloc, tmp_path,
                                                                   target):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    ref, _ = reference_parse(path)
    into = pinned_like(alloc, ref) if target == "into" else None
    before = (worker.stats().pinned_count, worker.stats().device_count, worker.live_views)
    seen = []

    def progress(done, total):
        seen.append(done)
        if len(seen) == 2:
            raise Stop(f"stopped at {done} of {total}")

    kwargs = {"into": into} if into else {"device": "sim:0"} if target == "device" else {}
    kwargs["ring_bytes"] = 4096  # device: 1 KiB pieces, one call each
    with pytest.raises(Stop, match=r"stopped at \d+ of 4401") as e:
        pinstage.load_file(path, worker=worker, threads=2, chunk_bytes=64, progress=progress,
                           **kwargs)
    # Checked with the exception (and its traceback's frames) still alive.
    assert len(seen) == 2  # no call after the one that raised
    assert (worker.stats().pinned_count, worker.stats().device_count,
            worker.live_views) == before
    assert worker.busy_calls == 0
    del e, into, kwargs
    worker.finalize()  # nothing pending, nothing held


def test_progress_must_be_callable(worker, tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, sample())
    with pytest.raises(TypeError, match=r"load_file\(\): progress must be a callable "
                                        r"\(done, total\), True \(a progress bar\) or None, "
                                        r"not int"):
        pinstage.load_file(path, worker=worker, progress=5)
    with pytest.raises(TypeError, match=r"load_to_device\(\): progress must be a callable"):
        pinstage.load_to_device(path, worker=worker, progress="50%")
