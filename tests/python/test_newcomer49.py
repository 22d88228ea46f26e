"""Issue 49, what a new user hit: finalize()'s refusal in a few lines, the state-dict shapes
users reach for (DeviceLoad as a Mapping, load_tp(mode=, device=), is_pinned of a map-mode
tensor), and a progress bar from the call to the last byte."""
import collections.abc
import gc
import io

import pytest
import torch

import pinstage
from test_py_checkpoint import write_file


def _layers(n):
    return {f"layer.{i:03d}.weight": torch.full((4, 4), float(i)) for i in range(n)}


@pytest.fixture
def forty(tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, _layers(40))
    return path


def _refusal(worker):
    with pytest.raises(BufferError) as e:
        worker.finalize()
    return str(e.value)


def test_finalize_refusal_names_the_first_tensors_then_how_many_more(worker, forty):
    tensors = pinstage.load_file(forty, worker=worker)
    msg = _refusal(worker)
    lines = msg.splitlines()
    assert lines[0].startswith("cannot finalize the worker: 40 pinned buffer(s) still have 40 "
                               "live view(s)"), msg
    assert lines[0].endswith("delete them first (del, then gc.collect() for cycles):"), msg
    named = [line.split("'")[1] for line in lines[1:-1]]
    assert len(named) == 5 and len(set(named)) == 5 and set(named) <= set(tensors), msg
    assert all("(float32 [4, 4]) in PinnedHostBuffer at 0x" in line for line in lines[1:-1]), msg
    assert lines[-1] == "  and 35 more", msg
    del tensors
    gc.collect()
    worker.finalize()


def test_a_device_loads_live_tensors_are_counted_not_all_named(worker, forty):
    dev = pinstage.load_to_device(forty, worker=worker)
    views = [dev.tensor(n) for n in dev.keys()]
    msg = _refusal(worker)
    assert len(msg.splitlines()) == 2, msg  # the summary, then the one DeviceLoad
    assert "'layer.004.weight' and 35 more of a DeviceLoad: 40 view(s)" in msg, msg
    assert "layer.005" not in msg, msg
    del views, dev
    gc.collect()


def test_a_device_load_is_a_state_dict(worker, forty):
    dev = pinstage.load_to_device(forty, worker=worker)
    assert isinstance(dev, collections.abc.Mapping)
    assert len(dev) == 40 and list(dev) == dev.keys() and "layer.007.weight" in dev
    assert 7 not in dev and "nope" not in dev
    assert torch.equal(dev["layer.007.weight"], torch.full((4, 4), 7.0))
    with pytest.raises(KeyError):
        dev["nope"]
    assert dev.get("nope") is None
    assert [k for k, _ in dev.items()] == dev.keys()
    model = _Layers(40)  # its parameters are named as the checkpoint's tensors
    assign = "assign" in torch.nn.Module.load_state_dict.__code__.co_varnames  # torch >= 2.1
    model.load_state_dict(dev, **({"assign": True} if assign else {}))
    weight = getattr(model.layer, "003").weight
    assert torch.equal(weight, torch.full((4, 4), 3.0))
    if assign:  # the parameter is the device memory itself, no copy
        assert weight.data_ptr() == dev.device_ptr("layer.003.weight")
    del model, weight
    gc.collect()
    dev.close()
    assert len(dev) == 0 and "layer.007.weight" not in dev


def test_a_map_mode_host_load_is_a_state_dict_too(worker, forty):
    sd = pinstage.load_file(forty, worker=worker, mode="map")
    assert isinstance(sd, collections.abc.Mapping)
    model = _Layers(40)
    assign = "assign" in torch.nn.Module.load_state_dict.__code__.co_varnames
    model.load_state_dict(sd, **({"assign": True} if assign else {}))
    weight = getattr(model.layer, "005").weight
    assert torch.equal(weight, torch.full((4, 4), 5.0))
    if assign:  # the parameter is the read-only mapping itself
        assert isinstance(weight, pinstage.ReadOnlyTensor)
        assert weight.data_ptr() == sd["layer.005.weight"].data_ptr()
    del model, weight, sd
    gc.collect()


class _Layers(torch.nn.Module):
    """layer.000.weight ... layer.{n-1}.weight, as the test checkpoint names them."""

    def __init__(self, n):
        super().__init__()
        self.layer = torch.nn.Module()
        for i in range(n):
            setattr(self.layer, f"{i:03d}", torch.nn.Linear(4, 4, bias=False))


def test_is_pinned_answers_for_a_map_mode_tensor(worker, forty):
    tensors = pinstage.load_file(forty, worker=worker, mode="map")
    t = tensors["layer.001.weight"]
    assert worker.is_pinned_host(t.data_ptr(), 64)
    assert pinstage.is_pinned(t)
    assert pinstage.PinnedTorchAllocator(worker).is_pinned(t)
    assert not pinstage.PinnedTorchAllocator(pinstage.Worker()).is_pinned(t)  # not that one's
    assert not pinstage.is_pinned(torch.zeros(4, 4))
    del tensors, t
    gc.collect()
    assert not pinstage.is_pinned(torch.zeros(4, 4))


def test_a_map_mode_tensor_uploads_and_is_named_read_only_as_a_destination(worker, forty):
    tensors = pinstage.load_file(forty, worker=worker, mode="map")
    t = tensors["layer.002.weight"]
    dev = worker.alloc_device(64)
    event = worker.copy_to_device_async(dev, t)  # pinned in place: uploaded as it is
    del tensors, t
    gc.collect()  # the pending copy keeps the mapping alive
    event.wait()
    assert torch.equal(dev.as_tensor(torch.float32, (4, 4)), torch.full((4, 4), 2.0))
    again = pinstage.load_file(forty, worker=worker, mode="map")["layer.003.weight"]
    with pytest.raises(pinstage.InvalidArgumentError) as e:
        worker.copy_to_host_async(again, dev)
    assert "read-only map-mode view" in str(e.value) and "pageable" not in str(e.value)
    assert torch.equal(worker.to_device(again), torch.full((4, 4), 3.0))


def _tp_checkpoint(tmp_path):
    path = tmp_path / "tp.safetensors"
    g = torch.Generator().manual_seed(3)
    write_file(path, {"q.weight": torch.randn(8, 6, generator=g),
                      "o.weight": torch.randn(6, 8, generator=g),
                      "norm": torch.randn(6, generator=g)})
    return path


@pytest.mark.parametrize("mode", ["copy", "map"])
@pytest.mark.parametrize("device", ["cpu", "sim:0"])
def test_load_tp_takes_mode_and_device(worker, tmp_path, mode, device):
    path = _tp_checkpoint(tmp_path)
    plan = pinstage.TpPlan().split("q.*", 0).split("o.*", 1)
    whole = pinstage.load_file(path, worker=worker)
    want = {n: t.clone() for n, t in whole.items()}
    del whole
    load = pinstage.load_tp(path, 2, plan, worker=worker, mode=mode, device=device)
    for rank in range(2):
        got = load.ranks[rank]
        assert torch.equal(got["q.weight"], want["q.weight"][4 * rank:4 * rank + 4])
        assert torch.equal(got["o.weight"], want["o.weight"][:, 4 * rank:4 * rank + 4])
        assert torch.equal(got["norm"], want["norm"])
        mapped = [isinstance(t, pinstage.ReadOnlyTensor) for t in got.values()]
        assert all(mapped) if (mode, device) == ("map", "cpu") else not any(mapped)
    assert load.report["load"]["mode"] == mode
    assert load.report["replicated"] == 1 and load.report["contiguous"] == 1
    assert load.report["strided"] == 1
    if mode == "map":
        assert load.report["read_bytes"] == 0 and load.report["host_bytes"] == 0
    if device != "cpu":
        assert load.report["device"]["uploaded_bytes"] == 8 * 6 * 4 * 2 + 6 * 4
        shared = load.ranks[0]["norm"]
        assert shared.data_ptr() == load.ranks[1]["norm"].data_ptr()  # one upload for both
        assert not worker.is_pinned_host(shared.data_ptr(), 24)  # device memory, not host
    del load
    gc.collect()


def test_load_tp_refuses_numpy_on_a_device_and_a_bad_mode(worker, tmp_path):
    path = _tp_checkpoint(tmp_path)
    with pytest.raises(pinstage.InvalidArgumentError, match="framework='pt'"):
        pinstage.load_tp(path, 2, worker=worker, framework="numpy", device="sim:0")
    with pytest.raises(pinstage.InvalidArgumentError, match="copy"):
        pinstage.load_tp(path, 2, worker=worker, mode="mmap")
    with pytest.raises(pinstage.InvalidArgumentError, match="cuda"):
        pinstage.load_tp(path, 2, worker=worker, device="cuda:0")


class _Tty(io.StringIO):
    def isatty(self):
        return True


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_bar_draws_from_the_call_and_rates_the_whole_load():
    from pinstage.checkpoint import _ProgressBar
    clock, out = _Clock(), _Tty()
    with _ProgressBar("load_file", stream=out, delay=1.0, clock=clock, tick=None) as bar:
        bar.phase("allocate")
        assert bar.drawn == 0  # the first second stays quiet
        clock.now += 1.5
        bar.tick()  # no byte has moved yet, and the bar is there, naming the phase
        assert bar.drawn == 1 and "allocate" in out.getvalue() and "1.5 s" in out.getvalue()
        clock.now += 0.5
        bar.phase("read")
        clock.now += 0.5
        bar(1_000_000_000, 2_000_000_000)
        line = out.getvalue().rsplit("\r", 1)[1]
        assert "read" in line and "1.00/2.00 GB" in line
        assert "0.40 GB/s" in line  # 1 GB over the 2.5 s since the call, not over the read
        clock.now += 0.5
        bar(2_000_000_000, 2_000_000_000)
    last = out.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("load_file: 2.00 GB in 3.00 s, 0.67 GB/s (allocate 2.00 s, "
                           "read 1.00 s)"), last
    assert last.endswith("\n")


def test_a_quick_load_draws_nothing_at_all():
    from pinstage.checkpoint import _ProgressBar
    out = _Tty()
    with _ProgressBar("load_file", stream=out, delay=1.0, clock=_Clock(), tick=None) as bar:
        bar.phase("allocate")
        bar(10, 10)
    assert out.getvalue() == ""


class _Recorder:
    """A progress callable with a phase() method: what the C++ load tells it, in order."""

    def __init__(self):
        self.events = []

    def phase(self, name):
        self.events.append(name)

    def __call__(self, done, total):
        if not self.events or self.events[-1] != "bytes":
            self.events.append("bytes")


@pytest.mark.parametrize("call,want", [
    (lambda p, w, r: pinstage.load_file(p, worker=w, progress=r),
     ["allocate", "read", "bytes"]),
    (lambda p, w, r: pinstage.load_file(p, worker=w, progress=r, verify="if-present"),
     ["allocate", "read", "bytes", "verify"]),
    (lambda p, w, r: pinstage.load_file(p, worker=w, progress=r, mode="map"),
     ["pin", "bytes"]),
    (lambda p, w, r: pinstage.load_to_device(p, worker=w, progress=r),
     ["allocate", "read+upload", "bytes"]),
    (lambda p, w, r: pinstage.load_to_device(p, worker=w, progress=r, mode="map"),
     ["pin", "allocate", "upload", "bytes"]),
    (lambda p, w, r: pinstage.load_tp(p, 2, worker=w, progress=r),
     ["allocate", "read", "bytes"]),
], ids=["copy", "copy-verify", "map", "device", "device-map", "tp"])
def test_each_load_names_its_phases_as_they_begin(worker, forty, call, want):
    recorder = _Recorder()
    loaded = call(forty, worker, recorder)
    assert recorder.events == want
    del loaded
    gc.collect()
