"""pinstage.iter_tensors, the engines' weight iterator (docs/engines.md): every tensor
load_file gives, in file order, in both modes; one file at a time (a caller that drops
each tensor holds at most one file's pinned copies); everything checked before the first
tensor; progress over the whole checkpoint."""
import gc

import pytest

import pinstage
import tp_checkpoint


@pytest.fixture
def model(tmp_path):
    return tp_checkpoint.write_checkpoint(tmp_path)[0]


@pytest.mark.parametrize("mode", ["copy", "map"])
def test_every_tensor_load_file_gives_in_file_order(model, worker, mode):
    want = pinstage.load_file(model, worker=worker)
    got = list(pinstage.iter_tensors(model, worker=worker, mode=mode))
    with pinstage.safe_open(model, worker=worker) as f:
        assert [n for n, _ in got] == f.keys()  # file order
    for name, t in got:
        assert isinstance(t, pinstage.ReadOnlyTensor) == (mode == "map")
        assert t.dtype == want[name].dtype and (t == want[name]).all(), name


def test_a_caller_that_drops_each_tensor_holds_one_file(model, worker):
    with pinstage.safe_open(model, worker=worker) as f:
        per_file = {}
        for name in f.keys():
            info = f.info(name)
            per_file[info["file"]] = per_file.get(info["file"], 0) + info["nbytes"]
    files = 0
    for _name, t in pinstage.iter_tensors(model, worker=worker):
        del t
        files = len(per_file)
    gc.collect()
    peak = worker.host_memory_stats()["allocated_bytes.peak"]
    assert files == 5 and peak < sum(per_file.values())
    assert peak <= max(per_file.values()) + 5 * 4096  # one file's tensors (page-rounded)


def test_everything_is_checked_before_the_first_tensor(model, worker):
    with pytest.raises(pinstage.InvalidArgumentError, match="does not hold"):
        pinstage.iter_tensors(model, worker=worker, names=["no.such.tensor"])
    with pytest.raises(pinstage.InvalidArgumentError, match="mode must be"):
        pinstage.iter_tensors(model, worker=worker, mode="mmap")
    with pytest.raises(TypeError, match="worker"):
        pinstage.iter_tensors(model, worker=None)


def test_names_and_progress_over_the_whole_checkpoint(model, worker):
    calls = []
    names = lambda n: n.endswith(".cube")  # noqa: E731 (4 tensors in 4 files)
    got = dict(pinstage.iter_tensors(model, worker=worker, names=names,
                                     progress=lambda d, t: calls.append((d, t))))
    assert sorted(got) == sorted(n for n in tp_checkpoint.arrays() if names(n))
    total = sum(t.numel() * t.element_size() for t in got.values())
    assert calls and all(t == total for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total
