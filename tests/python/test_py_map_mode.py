"""Issue 39 from Python: the one C++ load behind load_file / safe_open (reserved once, one
crossing), map mode (read-only views of the page cache, pinned in place) checked against
the hand-written reference parser of test_py_checkpoint, the load reports, progress=True,
and a 70,000-tensor checkpoint on a pool without a cache (issue 41, defect 4)."""
import gc
import io
import json
import struct

import numpy as np
import pytest
import torch

import pinstage
from test_py_checkpoint import reference_parse, small_checkpoint


def _vmlck():
    for line in open("/proc/self/status"):
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def ckpt(tmp_path):
    return small_checkpoint(tmp_path / "m.safetensors", 7, empty=torch.zeros(0, 4))


def test_map_mode_is_the_files_bytes_read_only_and_pinned(worker, ckpt):
    ref, _ = reference_parse(ckpt)
    locked = _vmlck()
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", report=True)
    assert report["mode"] == "map" and report["map_note"] == ""
    assert worker.host_memory_stats()["segment.current"] == 0  # no pool memory taken
    for name, want in ref.items():
        got = tensors[name]
        assert isinstance(got, pinstage.ReadOnlyTensor)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8) if got.numel() else got,
                           want.view(torch.uint8) if want.numel() else want), name
    a = tensors["a"]
    assert worker.is_pinned_host(a.data_ptr(), a.numel() * a.element_size())
    assert _vmlck() >= locked + ckpt.stat().st_size // 4096 * 4096  # really locked (sim: mlock)
    with pytest.raises(pinstage.ReadOnlyError, match="clone"):
        a.add_(1)
    with pytest.raises(pinstage.ReadOnlyError):
        a[0, 0] = 3
    with pytest.raises(pinstage.ReadOnlyError):
        torch.add(a, 1, out=a)
    row = a[1]  # a view of the mapping stays read-only
    assert isinstance(row, pinstage.ReadOnlyTensor)
    with pytest.raises(pinstage.ReadOnlyError):
        row.zero_()
    plain = a + 1  # a new result is an ordinary tensor
    assert not isinstance(plain, pinstage.ReadOnlyTensor)
    plain.add_(1)
    copy = a.clone()
    copy.zero_()
    assert torch.equal(a, ref["a"])
    del tensors, a, row
    gc.collect()
    assert _vmlck() <= locked + 4096  # the last view went: unpinned


def test_map_mode_numpy_arrays_refuse_writes(worker, ckpt):
    with pinstage.safe_open(ckpt, framework="numpy", worker=worker, mode="map") as f:
        b = f.get_tensor("b")
        assert f.report["mode"] == "map"
    assert not b.flags.writeable
    with pytest.raises(ValueError):
        b[0] = 1.0
    np.testing.assert_array_equal(b, reference_parse(ckpt)[0]["b"].numpy())


def test_map_mode_device_load_uploads_from_the_mapping(worker, ckpt):
    d = pinstage.load_to_device(ckpt, worker=worker, mode="map")
    assert d.report["mode"] == "map" and d.report["ring_pinned_bytes"] == 0
    ref, _ = reference_parse(ckpt)
    assert d.to_bytes("b") == ref["b"].numpy().tobytes()
    d.close()


def test_copy_mode_report_and_safe_open_report(worker, ckpt):
    tensors, report = pinstage.load_file(ckpt, worker=worker, report=True)
    for key in ("bytes", "total_s", "alloc_s", "read_s", "verify_s", "mode", "map_s", "pin_s",
                "peak_pinned_bytes"):
        assert key in report, key
    assert report["mode"] == "copy" and report["tensors"] == 4
    tensors["a"].add_(1)  # copy mode: writable
    with pinstage.safe_open(ckpt, worker=worker) as f:
        assert f.report is None
        f.get_tensor("c")
        assert f.report["bytes"] == 17 * 8 and f.report["tensors"] == 1


def test_bad_mode_and_mode_with_into_are_refused(worker, ckpt):
    with pytest.raises(pinstage.InvalidArgumentError, match="'copy'.*'map'"):
        pinstage.load_file(ckpt, worker=worker, mode="mmap")
    with pytest.raises(pinstage.InvalidArgumentError, match="page cache"):
        pinstage.load_file(ckpt, worker=worker, mode="map", direct=True)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_waits_a_second_then_draws_on_a_terminal():
    from pinstage.checkpoint import _ProgressBar
    quiet = _ProgressBar("load_file", stream=_Tty(), delay=3600)
    quiet(5, 10)
    assert quiet.drawn == 0  # a quick load stays quiet
    out = _Tty()
    with _ProgressBar("load_file", stream=out, delay=0, tick=None) as bar:
        bar(5, 10)
        bar(10, 10)
    assert bar.drawn == 2
    assert "load_file" in out.getvalue() and out.getvalue().endswith("\n")
    piped = _ProgressBar("load_file", stream=io.StringIO(), delay=0)
    piped(5, 10)
    assert piped.drawn == 0  # not a terminal: nothing


def test_seventy_thousand_tensors_without_a_cache_map_one_segment(tmp_path):
    """Defect 4 of issue 41: Python's load_file reserved nothing, so with
    host_cache_limit_bytes=0 each tensor mapped its own segment and 70,000 tensors ran out
    of mappings ("mmap of 4096 bytes failed"). The one C++ load reserves once."""
    n = 70_000
    header, off = {}, 0
    for i in range(n):
        header[f"t{i}"] = {"dtype": "U8", "shape": [3], "data_offsets": [off, off + 3]}
        off += 3
    text = json.dumps(header).encode()
    data = bytes(range(256)) * (off // 256 + 1)
    path = tmp_path / "many.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[:off])
    w = pinstage.Worker(host_cache_limit_bytes=0)
    tensors = pinstage.load_file(path, worker=w)
    assert len(tensors) == n
    assert tensors["t69999"].tolist() == list(data[3 * 69999:3 * 70000])
    stats = w.host_memory_stats()
    assert stats["num_host_alloc"] == 1, stats  # one reserved segment for the lot
    del tensors
    gc.collect()
    w.finalize()
