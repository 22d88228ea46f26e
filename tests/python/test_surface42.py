"""Issue 42, what a torch user reaches for: typed device tensors (DeviceLoad.tensor,
DeviceBuffer.as_tensor), one tensor to the device and back (Worker.to_device/to_host),
finalize()'s refusal naming the live tensors, and one name per backend (acl, never npu)."""
import gc
import re

import pytest
import torch

import pinstage
from test_py_checkpoint import write_file


def checkpoint(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {
        "model.layers.0.q_proj.weight": torch.arange(24, dtype=torch.float32).reshape(4, 6).bfloat16(),
        "model.norm.weight": torch.linspace(-1, 1, 5, dtype=torch.float16),
        "ids": torch.arange(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }
    write_file(path, tensors)
    return path, tensors


# ---- typed device tensors ----

def test_device_load_tensor_is_typed_shaped_and_zero_copy(worker, tmp_path):
    path, ref = checkpoint(tmp_path)
    load = pinstage.load_to_device(path, worker=worker)
    assert isinstance(load, pinstage.DeviceLoad)
    for name, want in ref.items():
        t = load.tensor(name)
        assert t.dtype == want.dtype and tuple(t.shape) == tuple(want.shape), name
        assert t.device.type == "cpu"  # sim's device memory is host RAM (docs/python.md)
        assert torch.equal(t, want), name
        if want.numel():
            assert t.data_ptr() == load.device_ptr(name)  # a view, not a copy


def test_device_load_tensor_keeps_the_load_closed_refused(worker, tmp_path):
    path, _ = checkpoint(tmp_path)
    load = pinstage.load_to_device(path, worker=worker)
    t = load.tensor("ids")
    with pytest.raises(BufferError, match=r"cannot close the DeviceLoad: 1 view\(s\) .*'ids'"):
        load.close()
    del t
    gc.collect()
    load.close()
    with pytest.raises(pinstage.Error, match=r"no tensor 'ids' \(it is closed"):
        load.tensor("ids")


def test_device_load_tensor_unknown_name(worker, tmp_path):
    path, _ = checkpoint(tmp_path)
    load = pinstage.load_to_device(path, worker=worker)
    with pytest.raises(pinstage.Error, match=r"DeviceLoad.tensor\('nope'\): the device load has "
                                             r"no tensor 'nope'"):
        load.tensor("nope")


def test_device_buffer_as_tensor(worker):
    buf = worker.alloc_device(64)
    t = buf.as_tensor(torch.int32, (4, 4))
    assert t.dtype == torch.int32 and tuple(t.shape) == (4, 4) and t.device.type == "cpu"
    assert t.data_ptr() == buf.device_ptr
    t.fill_(7)
    assert buf.as_tensor(torch.int32, [16]).tolist() == [7] * 16
    with pytest.raises(BufferError, match="DLPack view"):
        buf.close()


@pytest.mark.parametrize("dtype, shape, error, message", [
    (torch.float32, (5, 4), pinstage.InvalidArgumentError,
     r"as_tensor: torch.float32 \(5, 4\) needs 80 bytes; the DeviceBuffer has 64"),
    ("float32", (4,), TypeError, r"dtype must be a torch.dtype, not str"),
    (torch.float32, (-1,), pinstage.InvalidArgumentError, r"has a negative size"),
])
def test_device_buffer_as_tensor_refusals(worker, dtype, shape, error, message):
    buf = worker.alloc_device(64)
    with pytest.raises(error, match=message):
        buf.as_tensor(dtype, shape)
    buf.close()  # no view was left behind


# ---- Worker.to_device / to_host ----

def test_to_device_and_back(worker):
    x = torch.randn(3, 5).bfloat16()
    d = worker.to_device(x)
    assert d.dtype == x.dtype and tuple(d.shape) == (3, 5) and torch.equal(d, x)
    assert d.data_ptr() != x.data_ptr()  # device memory, not the source
    h = worker.to_host(d)
    assert torch.equal(h, x) and pinstage.is_pinned(h)
    assert h.float().numpy().shape == (3, 5)  # NumPy can use it


def test_to_device_takes_numpy_and_non_blocking(worker):
    np = pytest.importorskip("numpy")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    pending = worker.to_device(a, non_blocking=True)
    assert isinstance(pending, pinstage.PendingTensor)
    d = pending.wait()
    assert pending.done and pending.wait() is d
    assert (np.from_dlpack(d) == a).all()  # on sim the device tensor is a CPU one
    back = worker.to_host(d, non_blocking=True).wait()
    assert (back.numpy() == a).all()


def test_to_host_of_a_device_load_tensor(worker, tmp_path):
    path, ref = checkpoint(tmp_path)
    load = pinstage.load_to_device(path, worker=worker)
    h = worker.to_host(load.tensor("model.norm.weight"))
    assert torch.equal(h, ref["model.norm.weight"]) and pinstage.is_pinned(h)


def test_to_device_and_to_host_refusals(worker):
    with pytest.raises(TypeError, match=r"to_device: expected a torch.Tensor or a numpy.ndarray, "
                                        r"not list"):
        worker.to_device([1, 2])
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"to_host: the tensor's 16 bytes are not inside one DeviceBuffer or "
                             r"DeviceLoad of this worker"):
        worker.to_host(torch.zeros(4))


# ---- finalize() names the live tensors ----

@pytest.mark.filterwarnings("error")  # the refusal's walk over live objects warns of nothing
def test_finalize_names_a_loaded_tensor(tmp_path):
    w = pinstage.Worker()
    path, _ = checkpoint(tmp_path)
    tensors = pinstage.load_file(path, worker=w)
    stray = tensors["model.layers.0.q_proj.weight"]  # the loop variable the issue found by hand
    del tensors
    gc.collect()
    with pytest.raises(BufferError) as refused:
        w.finalize()
    assert "tensor 'model.layers.0.q_proj.weight' (bfloat16 [4, 6]) in PinnedHostBuffer" \
        in str(refused.value)
    del stray
    gc.collect()
    w.finalize()


def test_finalize_names_task_args_and_device_tensors(tmp_path):
    w = pinstage.Worker()
    alloc = pinstage.PinnedTorchAllocator(w)
    args = pinstage.TaskArgs()
    args.add("hidden", alloc.zeros((2, 8), dtype=torch.float16))
    path, _ = checkpoint(tmp_path)
    load = pinstage.load_to_device(path, worker=w)
    norm = load.tensor("model.norm.weight")
    unnamed = alloc.empty((3, 7), dtype=torch.int32)
    with pytest.raises(BufferError) as refused:
        w.finalize()
    text = str(refused.value)
    assert "tensor 'hidden' (float16 [2, 8]) in PinnedHostBuffer" in text
    assert "tensor 'model.norm.weight' of a DeviceLoad: 1 view(s)" in text
    assert re.search(r"int32 \[3, 7\] in PinnedHostBuffer at 0x[0-9a-f]+", text), text
    del args, norm, unnamed, load
    gc.collect()
    w.finalize()


# ---- one name per backend ----

def test_npu_is_refused_everywhere_naming_acl(worker, tmp_path):
    path, _ = checkpoint(tmp_path)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"pass device='acl:0'"):
        pinstage.load_file(path, worker=worker, device="npu:0")
    with pytest.raises(pinstage.Error, match=r"npu"):
        pinstage.Worker(backend="npu").init()
    # acl is the one name: load_file takes it (and then checks it is the worker's device)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"device 'acl:0' is backend 'acl'"):
        pinstage.load_file(path, worker=worker, device="acl:0")


# ---- sim's device first touch, reported apart ----

def test_a_sim_device_load_reports_its_first_touch_apart(worker, tmp_path):
    path = tmp_path / "big.safetensors"
    write_file(path, {"w": torch.zeros(1 << 20, dtype=torch.float32)})  # 4 MiB
    first = pinstage.load_to_device(path, worker=worker)
    report = first.report
    assert report["device_first_touch_bytes"] >= 4 << 20
    assert 0 < report["device_first_touch_s"] <= report["alloc_s"]
    assert "sim's device memory is host RAM" in report["device_first_touch_reason"]
    first.close()
    again = pinstage.load_to_device(path, worker=worker).report  # the pages stay backed
    assert again["device_first_touch_bytes"] == 0 and again["device_first_touch_s"] == 0


# ---- a worker collected without finalize() leaves no stream behind ----

def test_a_collected_worker_that_copied_async_warns_of_no_live_stream(build_dir, tmp_path):
    """docs/distributed.md's ranks ended with "finalize: 1 stream(s) still alive": the
    Worker's copy stream outlived the context when the worker was collected unfinalized."""
    import os
    import subprocess
    import sys

    script = tmp_path / "unfinalized.py"
    script.write_text(
        "import torch, pinstage\n"
        "w = pinstage.Worker()\n"
        "x = pinstage.PinnedTorchAllocator(w).ones(1024)\n"
        "d = w.alloc_device(4096)\n"
        "w.copy_to_device_async(d, x).wait()\n"
        "del x, d, w\n"  # no finalize(): the worker is collected
        "import gc; gc.collect()\n"
        "print('collected')\n")
    env = dict(os.environ, PYTHONPATH=str(build_dir / "python"))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "collected\n", proc.stderr
    assert "still alive" not in proc.stderr, proc.stderr
