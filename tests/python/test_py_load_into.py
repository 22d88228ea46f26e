"""load_file(into=...) and safe_open(...).get_tensor(name, out=...): checkpoints read into
pinned tensors the caller already holds, checked before any byte is written; the bytes
compared with the hand-written reference parser of test_py_checkpoint.py."""
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
