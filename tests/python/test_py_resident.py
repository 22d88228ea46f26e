"""ResidentBinder and decode steps from Python: only what changed goes up, the caches stay on
the device, an undeclared write is caught by the debug check, and run_scene(steps=N)."""
import gc

import pytest
import torch

import pinstage
from pinstage import ResidentBinder, TaskArgs


def fill_index_pattern(nbytes, k):
    """sim.fill_index: byte j of argument k becomes (j + 7k) & 0xff."""
    return (torch.arange(nbytes, dtype=torch.int64) + 7 * k).remainder(256).to(torch.uint8)


def make_args(alloc):
    x = alloc.copy(torch.arange(1000, dtype=torch.int32))
    c = alloc.copy(torch.full((300,), 5, dtype=torch.uint8))
    y = alloc.zeros((64,), torch.uint8)
    args = TaskArgs()
    args.add("x", x)
    args.add("c", c, "inout")
    args.add("y", y, "out")
    return args, x, c, y


def test_only_marked_inputs_go_up_and_inout_stays_on_the_device(worker, alloc):
    args, x, c, y = make_args(alloc)
    with ResidentBinder(worker, args, execute="sim.fill_index", check_writes=False) as rb:
        r1 = rb.step()
        assert (r1.step, r1.uploaded_bytes, r1.downloaded_bytes) == (1, 4000 + 300, 64)
        assert torch.equal(y, fill_index_pattern(64, 2))  # OUT came back
        assert c[0].item() == 5  # INOUT stayed on the device: its host copy is untouched
        r2 = rb.step()
        assert (r2.uploaded_bytes, r2.stayed_count, r2.stayed_bytes) == (0, 2, 4300)
        assert all(t.stayed for t in r2.tensors if t.direction != "OUT")
        assert r2.staging_seconds >= 0 and "2 stayed on the device" in r2.summary()
        rb.mark_changed("x")
        r3 = rb.step()
        assert r3.uploaded_bytes == 4000 and [t.name for t in r3.tensors if t.uploaded] == ["x"]
        rb.download("c", 10, 5)
        assert torch.equal(c[10:15], fill_index_pattern(300, 1)[10:15])
        assert c[0].item() == 5 and c[15].item() == 5
        rb.download("c")
        assert torch.equal(c, fill_index_pattern(300, 1))
        assert rb.steps == 3 and rb.device_bytes > 0 and rb.is_open
    assert not rb.is_open and rb.device_bytes == 0
    assert worker.stats().device_count == 0


def test_bad_calls_are_refused(worker, alloc):
    args = make_args(alloc)[0]
    rb = ResidentBinder(worker, args, execute="sim.fill_index")
    with pytest.raises(pinstage.Error, match="no tensor named 'nope'"):
        rb.mark_changed("nope")
    with pytest.raises(pinstage.InvalidArgumentError, match="OUT tensor is never uploaded"):
        rb.mark_changed("y")
    with pytest.raises(pinstage.InvalidArgumentError, match="before the first step"):
        rb.download("c")
    rb.step()
    with pytest.raises(pinstage.InvalidArgumentError, match="not a non-empty range"):
        rb.download("c", 299, 2)
    with pytest.raises(TypeError, match="TaskArgs"):
        ResidentBinder(worker, [1, 2])
    with pytest.raises(TypeError, match="check_writes"):
        ResidentBinder(worker, args, check_writes="yes")
    with pytest.raises(pinstage.InvalidArgumentError, match="staging_buffers"):
        ResidentBinder(worker, args, staging_buffers=0)
    rb.close()
    with pytest.raises(pinstage.InvalidArgumentError, match="closed"):
        rb.step()


def test_the_debug_check_names_an_undeclared_write(worker, alloc):
    args, x = make_args(alloc)[:2]
    rb = ResidentBinder(worker, args, execute="sim.fill_index", check_writes=True)
    assert rb.check_writes
    rb.step()
    x[7] = 12345  # a write through a zero-copy view, not declared
    with pytest.raises(pinstage.Error, match="IN tensor 'x' changed since its upload") as info:
        rb.step()
    assert info.value.code == "mismatch" and rb.is_open and rb.steps == 1
    rb.mark_changed("x")
    assert rb.step().uploaded_bytes == 4000


def test_a_live_resident_binder_holds_its_views_until_it_goes(alloc):
    worker = alloc.worker
    args = make_args(alloc)[0]
    rb = ResidentBinder(worker, args, execute="sim.fill_index")
    rb.step()
    del args
    gc.collect()
    # The binder keeps the torch tensors it stages: finalize refuses, naming them.
    with pytest.raises(BufferError, match="live view"):
        worker.finalize()
    assert rb.is_open and rb.step().step == 2
    del rb
    gc.collect()
    worker.finalize()
    assert not worker.initialized


def test_run_scene_steps_match_the_golden_and_move_only_the_step_inputs(worker):
    report = pinstage.run_scene(worker, "qwen3-decode", {"layers": 1, "seq_len": 127}, steps=3)
    assert report.ok and report.steps == 3 and report.resident and len(report.rounds) == 3
    full = report.rounds[0].bind.uploaded_bytes
    for step in report.rounds[1:]:
        assert step.comparison.ok and step.bind.uploaded_bytes == 2 * 16 * 4
        assert step.bind.uploaded_bytes * 1000 < full
    with pytest.raises(pinstage.InvalidArgumentError, match="steps must be in"):
        pinstage.run_scene(worker, "qwen3-decode", {"layers": 1, "seq_len": 5500}, steps=2)


def test_scene_advance_feeds_out_into_the_hidden_state(worker):
    args = pinstage.scene_make_args("qwen3-decode", {"layers": 1, "seq_len": 200})
    args.out.copy_(torch.full_like(args.out, 0.5))
    names = pinstage.scene_advance("qwen3-decode", args, 2, {"layers": 1, "seq_len": 200})
    assert names == ["hidden_states", "seq_lens", "slot_mapping"]
    assert torch.equal(args.hidden_states, args.out) and int(args.seq_lens[0]) == 202


def test_copy_on_device_feeds_an_output_back_without_an_upload(worker, alloc):
    x = alloc.copy(torch.arange(64, dtype=torch.uint8))
    y = alloc.zeros((64,), torch.uint8)
    args = TaskArgs()
    args.add("x", x)
    args.add("y", y, "out")
    rb = ResidentBinder(worker, args, execute="sim.fill_index")
    rb.step()
    assert torch.equal(y, fill_index_pattern(64, 1))  # step 1's out came back
    rb.copy_on_device("y", "x")
    assert torch.equal(x, torch.arange(64, dtype=torch.uint8))  # the host copy untouched
    rb.download("x")  # the device copy of x now holds y's bytes
    assert torch.equal(x, fill_index_pattern(64, 1))
    assert rb.step().uploaded_bytes == 0  # x is not uploaded over them
    with pytest.raises(pinstage.InvalidArgumentError, match="OUT tensor"):
        rb.copy_on_device("x", "y")


def test_device_memory_exports_through_dlpack_without_a_copy(worker, alloc):
    """On sim the device memory is host RAM: kDLCPU, so torch and NumPy see it in place."""
    import numpy as np

    d = worker.alloc_device(64)
    assert d.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(d)
    assert t.dtype == torch.uint8 and t.shape == (64,) and t.data_ptr() == d.device_ptr
    src = alloc.copy(torch.arange(64, dtype=torch.uint8))
    worker.copy_to_device_async(d, src).wait()
    assert torch.equal(t, torch.arange(64, dtype=torch.uint8))  # the bytes that arrived
    with pytest.raises(BufferError, match="DLPack view"):
        d.close()
    with pytest.raises(BufferError, match="copy must be None or False"):
        d.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="never moved"):
        d.__dlpack__(dl_device=(2, 0))
    if hasattr(np, "from_dlpack"):
        assert np.from_dlpack(d)[5] == 5
    del t, src
    gc.collect()
    d.close()
