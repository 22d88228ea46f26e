"""TaskArgs and Binder from Python: stage your own torch tensors (pinned or not)."""
import gc

import pytest
import torch

import pinstage
from pinstage import Binder, TaskArgs


def fill_index_pattern(nbytes, k):
    """sim.fill_index: byte j of argument k becomes (j + 7k) & 0xff."""
    return (torch.arange(nbytes, dtype=torch.int64) + 7 * k).remainder(256).to(torch.uint8)


def test_add_and_zero_copy_access(alloc):
    x = alloc.normal((4, 8), dtype=torch.bfloat16)
    y = torch.zeros(6, dtype=torch.int32)
    args = TaskArgs()
    args.add("x", x)
    args.add("y", y, direction="out")
    assert len(args) == 2 and args.names == ["x", "y"] and "x" in args and "z" not in args
    info = {d["name"]: d for d in args.describe()}
    assert info["x"] == {"name": "x", "dtype": "bf16", "shape": (4, 8), "direction": "IN",
                         "nbytes": 64, "pinned": True}
    assert info["y"]["pinned"] is False and info["y"]["direction"] == "OUT"
    assert args.total_bytes == 64 + 24 and args.input_bytes == 64 and args.input_count == 1
    view = args["x"]
    assert view.dtype == torch.bfloat16 and view.shape == (4, 8)
    assert view.data_ptr() == x.data_ptr()
    view[0, 0] = 3.0
    assert x[0, 0].item() == 3.0  # same memory
    args.y[5] = 9  # attribute access works too
    assert y[5].item() == 9
    with pytest.raises(KeyError, match="no tensor named 'z'"):
        args["z"]
    with pytest.raises(AttributeError, match="no tensor or attribute 'z'"):
        args.z


def test_add_validates_its_input():
    args = TaskArgs()
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        args.add("a", [1, 2])
    with pytest.raises(pinstage.InvalidArgumentError, match="not contiguous"):
        args.add("a", torch.zeros(4, 4).t())
    with pytest.raises(pinstage.InvalidArgumentError, match="dtype torch.complex64"):
        args.add("a", torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(pinstage.InvalidArgumentError, match="unknown direction 'sideways'"):
        args.add("a", torch.zeros(4), direction="sideways")
    args.add("a", torch.zeros(4), direction="INOUT")
    with pytest.raises(pinstage.InvalidArgumentError,
                       match="'a' is already there; names must be unique"):
        args.add("a", torch.zeros(4))
    assert len(args) == 1


@pytest.mark.parametrize("upload,layout", [("direct", "arena"), ("staged", "per_tensor")])
def test_binder_stages_torch_tensors(worker, alloc, upload, layout):
    pinned_in = alloc.normal((1024, 64))
    pageable_in = torch.randn(333)
    inout = alloc.zeros((256,), torch.int32)
    out = torch.zeros(100, dtype=torch.int64)
    args = TaskArgs()
    args.add("pinned_in", pinned_in)
    args.add("pageable_in", pageable_in)
    args.add("inout", inout, "inout")
    args.add("out", out, "out")
    before = pinned_in.clone()
    binder = Binder(worker, upload=upload, layout=layout, staging_buffer_bytes=4096,
                    execute="sim.fill_index")
    report = binder.run(args)
    assert report.executed and report.layout == layout
    assert report.uploaded_count == 3 and report.downloaded_count == 2
    assert report.uploaded_bytes == (1024 * 64 + 333 + 256) * 4
    assert [t.name for t in report.tensors] == ["pinned_in", "pageable_in", "inout", "out"]
    assert [t.pinned for t in report.tensors] == [True, False, True, False]
    assert (report.ring_count > 0) == (upload == "staged")
    assert list(report.phase_seconds) == ["device_alloc", "upload", "verify", "execute",
                                          "download", "release"]
    assert "tensors" in report.summary() and "upload" in str(report)
    # The callable wrote its pattern on the device; INOUT and OUT came back, IN did not.
    assert torch.equal(inout.view(torch.uint8), fill_index_pattern(1024, 2))
    assert torch.equal(out.view(torch.uint8), fill_index_pattern(800, 3))
    assert torch.equal(pinned_in, before)
    assert worker.stats().device_count == 0


def test_bind_error_names_phase_and_tensor(worker, alloc):
    args = TaskArgs()
    args.add("a", alloc.zeros((64,)))
    args.add("b", alloc.zeros((64,)))
    worker.inject_fault("copy_h2d", 2)
    with pytest.raises(pinstage.BindError) as e:
        Binder(worker).run(args)
    assert (e.value.phase, e.value.tensor, e.value.code) == ("upload", "b", "injected_fault")
    assert isinstance(e.value, pinstage.Error)
    assert worker.stats().device_count == 0  # the failed run released what it took


def test_binder_validates_options(worker):
    with pytest.raises(TypeError, match="Binder needs a pinstage.Worker, got str"):
        Binder("sim")
    with pytest.raises(pinstage.InvalidArgumentError, match="staging_buffers"):
        Binder(worker, staging_buffers=0)
    with pytest.raises(pinstage.InvalidArgumentError, match="arena_alignment"):
        Binder(worker, arena_alignment=3)
    with pytest.raises(pinstage.InvalidArgumentError, match="chunk_bytes must be >= 0"):
        Binder(worker, chunk_bytes=-1)
    with pytest.raises(pinstage.InvalidArgumentError, match="arena"):
        Binder(worker, layout="bogus")
    with pytest.raises(pinstage.InvalidArgumentError, match="direct"):
        Binder(worker, upload="bogus")
    with pytest.raises(pinstage.Error) as e:
        args = TaskArgs()
        args.add("a", torch.zeros(4))
        Binder(worker, execute="no.such.callable").run(args)
    assert e.value.code == "not_found" and e.value.phase == "execute"


def test_binder_guard_and_lifetime(capfd):
    w = pinstage.Worker(initialize=False)
    with pytest.raises(pinstage.InvalidArgumentError,
                       match="Binder needs an initialized chip-level worker"):
        Binder(w)
    w.init()
    binder = Binder(w, upload="staged")
    args = TaskArgs()
    args.add("a", torch.zeros(1000))
    binder.run(args)
    assert binder.worker is w and binder.staging_bytes == 4 * (8 << 20)
    w.finalize()  # releases the binder's ring and stream before the context
    assert binder.staging_bytes == 0
    assert "still alive" not in capfd.readouterr().err
    with pytest.raises(pinstage.Error) as e:
        binder.run(args)
    assert e.value.code == "finalized" and "new Worker and Binder" in str(e.value)


def test_task_args_hold_pinned_tensors_alive_and_counted(worker, alloc):
    args = TaskArgs()
    t = alloc.full((16,), 4.0)
    args.add("t", t)
    del t
    gc.collect()
    with pytest.raises(BufferError, match=r"2 view\(s\), 1 of them held by TaskArgs"):
        worker.finalize()  # the args still hold the tensor (its view, and their lease)
    assert args["t"].sum().item() == 64.0
    del args
    gc.collect()
    worker.finalize()


def test_verify_upload_catches_a_corrupted_upload(worker, alloc):
    args = TaskArgs()
    args.add("a", alloc.normal((4096,)))
    args.add("b", alloc.normal((4096,)))
    worker.inject_fault("corrupt_h2d", 2)  # the second upload flips one byte on the device
    with pytest.raises(pinstage.BindError) as e:
        Binder(worker, verify_upload=True).run(args)
    assert (e.value.phase, e.value.tensor, e.value.code) == ("verify", "b", "mismatch")
    Binder(worker, verify_upload=True).run(args)  # no fault: verifies clean (no BindError)
    # That verify reads every upload back is proven by what it copies, in the next test.


def test_verify_reads_every_upload_back(worker, alloc):
    """verify ran, proved by what it does: inputs only, so a bind without verify copies
    nothing back, while verify reads each upload back (and meets the injected fault)."""
    args = TaskArgs()
    args.add("a", alloc.normal((4096,)))
    worker.inject_fault("copy_d2h", 1)
    with pytest.raises(pinstage.BindError) as e:
        Binder(worker, verify_upload=True).run(args)
    assert (e.value.phase, e.value.tensor) == ("verify", "a")
    worker.inject_fault("copy_d2h", 1)
    report = Binder(worker, verify_upload=False).run(args)  # no read-back: no fault hit
    assert report.downloaded_count == 0
