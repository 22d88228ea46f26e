"""Issue 50 from Python: pinstage.cache (info, put, lookup, ls, rm, prune) and the cache=
keyword of load_file / safe_open / load_to_device over a cache directory of this test's
own in /dev/shm (tmpfs), each result checked against the checkpoint's bytes read by hand
(test_py_checkpoint's reference parser); and pinstage.distributed.fill_cache at 2 ranks
under torchrun: exactly one rank fills, both load bytes equal to the source's, and
nothing but the entry is left in /dev/shm. The directory checks (owner, mode, symlinks,
another user) and the crash cases are tests/cpp/test_cache.cpp's; here only that Python
passes their errors on."""
import ast
import fcntl
import gc
import inspect
import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
import torch

import pinstage
import pinstage.cache
import tp_checkpoint
from test_py_checkpoint import reference_parse, small_checkpoint, write_file

HERE = pathlib.Path(__file__).resolve().parent
SHM = pathlib.Path("/dev/shm")


@pytest.fixture
def cache_dir(monkeypatch):
    """A cache directory of this test (mkdtemp: the user's, mode 0700) named by
    PINSTAGE_CACHE_DIR, removed afterwards."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="pinstage-test50-", dir=SHM))
    monkeypatch.setenv("PINSTAGE_CACHE_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ckpt(tmp_path):
    return small_checkpoint(tmp_path / "m.safetensors", 50)


def same_bytes(tensors, ref):
    assert sorted(tensors) == sorted(ref)
    for name, want in ref.items():
        got = tensors[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert bytes(got.contiguous().view(torch.uint8).reshape(-1).numpy()) == \
            bytes(want.contiguous().view(torch.uint8).reshape(-1).numpy()), name


def mapped_file(address):
    """The file /proc/self/maps shows at `address` ("" for anonymous memory)."""
    for line in open("/proc/self/maps"):
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return fields[5].strip() if len(fields) > 5 else ""
    return ""


def entries(d):
    """What the cache directory holds besides lock files."""
    return sorted(p.name for p in d.iterdir() if not p.name.endswith(".lock"))


# ---- cache= on the loads ----

def test_the_default_is_off_and_opens_no_directory(worker, ckpt, tmp_path, monkeypatch):
    """Seen failing with cache="use" as load_file's default (the directory is made)."""
    d = tmp_path / "never-made"
    monkeypatch.setenv("PINSTAGE_CACHE_DIR", str(d))
    _, report = pinstage.load_file(ckpt, worker=worker, report=True)
    assert report["cache"] == "off" and report["cache_entry"] == ""
    with pinstage.safe_open(ckpt, worker=worker) as f:
        f.get_tensor("b")
        assert f.report["cache"] == "off"
    dev = pinstage.load_to_device(ckpt, worker=worker)
    assert dev.report["cache"] == "off"
    dev.close()
    assert not d.exists()
    assert pinstage.cache.DEFAULT == "off"
    for fn in (pinstage.load_file, pinstage.load_to_device, pinstage.safe_open):
        assert inspect.signature(fn).parameters["cache"].default == "off", fn


@pytest.mark.parametrize("call", ["load_file", "load_to_device", "safe_open"])
def test_bad_cache_values_are_refused_by_name_before_anything_is_opened(
        worker, ckpt, tmp_path, monkeypatch, call):
    d = tmp_path / "never-made"
    monkeypatch.setenv("PINSTAGE_CACHE_DIR", str(d))
    fn = getattr(pinstage, call)
    with pytest.raises(TypeError, match=rf"{call}\(\): cache must be str"):
        fn(ckpt, worker=worker, cache=True)
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=rf"{call}\(\): cache must be 'off' .*'use' .*'fill'.*got 'on'"):
        fn(ckpt, worker=worker, cache="on")
    with pytest.raises(pinstage.InvalidArgumentError, match="cache must be"):
        fn(tmp_path / "missing.safetensors", worker=worker, cache="USE")  # before the open
    assert not d.exists()


def test_into_and_cache_are_refused_together(worker, ckpt, cache_dir, alloc):
    into = {"c": alloc.zeros(17, dtype=torch.int64)}
    with pytest.raises(pinstage.InvalidArgumentError, match="into= .* cache='use' .*one of them"):
        pinstage.load_file(ckpt, worker=worker, into=into, cache="use")
    assert entries(cache_dir) == []


def test_fill_then_hit_maps_the_entry_with_the_sources_bytes(worker, ckpt, cache_dir):
    """map mode: "filled" then "hit"; the tensors are views of the entry's file in the
    cache directory (not of the source), with the source's bytes."""
    ref, _ = reference_parse(ckpt)
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", cache="fill",
                                         report=True)
    assert report["cache"] == "filled", report
    entry = pathlib.Path(report["cache_entry"])  # a file's entry: its file in the entry
    assert entry.parent.parent == cache_dir and entry.name == ckpt.name, entry
    same_bytes(tensors, ref)
    del tensors
    gc.collect()
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", cache="use",
                                         report=True)
    assert report["cache"] == "hit" and report["cache_entry"] == str(entry), report
    same_bytes(tensors, ref)
    a = tensors["a"]
    assert isinstance(a, pinstage.ReadOnlyTensor)
    where = mapped_file(a.data_ptr())
    assert where == str(entry), where  # mapped from the entry, in place
    assert worker.is_pinned_host(a.data_ptr(), a.numel() * a.element_size())
    # The entry is a checkpoint any loader reads: the reference parser reads its file.
    entry_ref, _ = reference_parse(pathlib.Path(where))
    same_bytes(entry_ref, ref)


def test_a_hit_in_copy_mode_is_writable_and_leaves_the_entry_as_it_was(worker, ckpt,
                                                                       cache_dir):
    ref, _ = reference_parse(ckpt)
    assert pinstage.cache.put(ckpt)["state"] == "filled"
    tensors, report = pinstage.load_file(ckpt, worker=worker, cache="use", report=True)
    assert report["cache"] == "hit" and report["mode"] == "copy", report
    same_bytes(tensors, ref)
    tensors["b"].zero_()  # a private copy: the entry does not change
    tensors["c"].add_(5)
    del tensors
    gc.collect()
    again, report = pinstage.load_file(ckpt, worker=worker, cache="use", report=True)
    assert report["cache"] == "hit"
    same_bytes(again, ref)


def test_use_on_a_miss_reads_the_source_and_writes_nothing(worker, ckpt, cache_dir):
    ref, _ = reference_parse(ckpt)
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", cache="use",
                                         report=True)
    assert report["cache"] == "miss" and report["cache_entry"] == "", report
    same_bytes(tensors, ref)
    assert mapped_file(tensors["a"].data_ptr()) == str(ckpt)
    assert entries(cache_dir) == []


def test_a_changed_source_is_stale_and_its_entry_never_used(worker, ckpt, cache_dir):
    """The source rewritten with other bytes of the same size: "stale" (the note names the
    file), the load gives the new bytes; "fill" then replaces the entry."""
    pinstage.cache.put(ckpt)
    g = torch.Generator().manual_seed(51)
    write_file(ckpt, {"a": torch.randn(300, 70, generator=g).bfloat16(),
                      "b": torch.randn(1000, generator=g),
                      "c": torch.arange(17, dtype=torch.int64) * 3})
    new, _ = reference_parse(ckpt)
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", cache="use",
                                         report=True)
    assert report["cache"] == "stale" and report["cache_entry"] == "", report
    assert "m.safetensors" in report["cache_note"], report
    same_bytes(tensors, new)
    assert pinstage.cache.lookup(ckpt)["state"] == "stale"
    del tensors
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", cache="fill",
                                         report=True)
    assert report["cache"] == "filled", report
    same_bytes(tensors, new)
    assert pinstage.cache.lookup(ckpt)["state"] == "hit"


def test_safe_open_and_map_slices_go_through_the_cache(worker, ckpt, cache_dir):
    ref, _ = reference_parse(ckpt)
    pinstage.cache.put(ckpt)
    with pinstage.safe_open(ckpt, worker=worker, mode="map", cache="use") as f:
        b = f.get_tensor("b")
        assert f.report["cache"] == "hit"
        assert torch.equal(b, ref["b"])
        rows = f.get_slice("a")[10:20]
        assert f.report["cache"] == "hit"
        assert torch.equal(rows, ref["a"][10:20])
        assert mapped_file(rows.data_ptr()).startswith(str(cache_dir) + "/")


def test_load_to_device_from_a_hit_uploads_from_the_mapping_without_a_ring(worker, ckpt,
                                                                          cache_dir):
    ref, _ = reference_parse(ckpt)
    pinstage.cache.put(ckpt)
    for mode in ("copy", "map"):
        dev = pinstage.load_to_device(ckpt, worker=worker, cache="use", mode=mode)
        assert dev.report["cache"] == "hit", dev.report
        assert dev.report["ring_pinned_bytes"] == 0, dev.report  # no ring copy
        for name, want in ref.items():
            assert dev.to_bytes(name) == bytes(want.view(torch.uint8).reshape(-1).numpy())
        dev.close()


def test_removing_an_entry_a_load_maps_leaves_its_tensors_intact(worker, ckpt, cache_dir):
    """rm while mapped: the mapping keeps the pages (an unlinked file lives while mapped);
    the next load misses."""
    ref, _ = reference_parse(ckpt)
    pinstage.cache.put(ckpt)
    tensors, report = pinstage.load_file(ckpt, worker=worker, mode="map", cache="use",
                                         report=True)
    assert report["cache"] == "hit", report
    pinstage.cache.rm(ckpt)
    assert entries(cache_dir) == []
    same_bytes(tensors, ref)
    where = mapped_file(tensors["a"].data_ptr())
    assert where.startswith(report["cache_entry"]) and where.endswith("(deleted)"), where
    assert pinstage.cache.lookup(ckpt)["state"] == "miss"


# ---- pinstage.cache ----

def test_the_module_mirrors_the_cache(ckpt, cache_dir, tmp_path):
    info = pinstage.cache.info()
    assert info["path"] == str(cache_dir) and info["fs"] == "tmpfs", info
    assert info["page_bytes"] == os.sysconf("SC_PAGE_SIZE") and info["entries"] == 0
    assert pinstage.cache.default_dir() == str(cache_dir)
    assert pinstage.cache.lookup(ckpt)["state"] == "miss"
    seen = []
    filled = pinstage.cache.put(ckpt, progress=lambda done, total: seen.append((done, total)))
    assert filled["state"] == "filled" and filled["key"] in filled["entry_path"]
    assert seen and seen[-1][0] == seen[-1][1] == ckpt.stat().st_size, seen[-3:]
    assert pinstage.cache.put(ckpt)["state"] == "hit"  # a second put finds it
    hit = pinstage.cache.lookup(ckpt)
    assert hit["state"] == "hit" and hit["entry_path"] == filled["entry_path"]
    (listed,) = pinstage.cache.ls()
    assert listed["key"] == filled["key"] and listed["state"] == "ok"
    assert listed["source"] == str(ckpt.resolve()) and listed["bytes"] >= ckpt.stat().st_size
    assert pinstage.cache.info()["entries"] == 1
    pinstage.cache.rm(filled["key"])  # by key
    assert pinstage.cache.ls() == []
    with pytest.raises(pinstage.Error, match=filled["key"]) as e:
        pinstage.cache.rm(ckpt)  # by path: nothing left
    assert e.value.code == "not_found"
    pinstage.cache.put(ckpt)
    pruned = pinstage.cache.prune(max_bytes=0)
    assert pruned["evicted"] == 1 and pruned["removed"] == [filled["key"]], pruned
    assert pinstage.cache.ls() == [] and entries(cache_dir) == []
    other = pathlib.Path(tempfile.mkdtemp(prefix="pinstage-test50-", dir=SHM))
    try:  # dir= overrides the setting
        assert pinstage.cache.info(dir=other)["path"] == str(other)
        assert pinstage.cache.put(ckpt, dir=other, numa_node=0)["entry_path"].startswith(
            str(other) + "/")
        assert pinstage.cache.ls() == []
    finally:
        shutil.rmtree(other)
    with pytest.raises(pinstage.InvalidArgumentError, match="neither hugetlbfs nor tmpfs"):
        pinstage.cache.info(dir=tmp_path)  # a copy on disk is no cache


class Stop(Exception):
    pass


def test_the_cache_says_whether_its_tmpfs_gives_huge_pages(cache_dir, cli):
    """`huge` in pinstage.cache.info() and `pinstage cache --json` is the tmpfs mount's
    huge= option as findmnt reads it ("never" when absent), and the text names the fix
    when it is no huge page. Seen failing with the hint left out."""
    if shutil.which("findmnt") is None:
        pytest.skip("no findmnt to read the mount independently")
    options = subprocess.run(["findmnt", "-n", "-o", "FS-OPTIONS", "--target", str(cache_dir)],
                             capture_output=True, text=True, check=True).stdout.split()[-1]
    huge = [o[5:] for o in options.split(",") if o.startswith("huge=")] or ["never"]
    shmem = pathlib.Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    kernel = shmem.read_text() if shmem.exists() else ""
    want = "never" if "[deny]" in kernel else "always" if "[force]" in kernel else huge[-1]
    assert pinstage.cache.info()["huge"] == want
    out = subprocess.run([str(cli), "cache", "--json", "-"], capture_output=True, text=True,
                         check=True)
    doc = json.loads(out.stdout)
    assert doc["huge"] == want and list(doc)[1:] == list(pinstage.cache.info()), doc
    text = subprocess.run([str(cli), "cache"], capture_output=True, text=True, check=True).stdout
    assert f"huge={want}" in text, text
    hint = "mount -t tmpfs -o huge=within_size"
    assert (hint in text) == (want not in ("within_size", "always")), text
    assert "docs/cache.md#tmpfs-with-huge-pages-no-reservation" in text or hint not in text


def test_prune_says_the_same_keys_in_python_and_the_cli(ckpt, cache_dir, cli):
    """pinstage.cache.prune()'s dict and `pinstage cache prune --json` come from the one
    report_fields(CachePruneReport): the same keys in the same order, `removed` a list of
    the keys removed. Seen failing with `removed` left out of report_fields."""
    key = pinstage.cache.put(ckpt)["key"]
    out = subprocess.run([str(cli), "cache", "prune", "--max-bytes", "0", "--json", "-"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["removed"] == [key] and doc["evicted"] == 1, doc
    pinstage.cache.put(ckpt)
    pruned = pinstage.cache.prune(max_bytes=0)
    assert list(doc)[1:] == list(pruned) == ["temps", "stale", "evicted", "freed_bytes",
                                             "removed"], (doc, pruned)
    assert pruned["removed"] == [key] and pruned["freed_bytes"] == doc["freed_bytes"], pruned
    assert entries(cache_dir) == []


def test_a_fill_stopped_by_its_progress_leaves_nothing(ckpt, cache_dir):
    """The callback's own exception comes back (not a pinstage.Error), and the fill's
    temporary is gone."""
    def stop(done, total):
        raise Stop("stop the fill")

    with pytest.raises(Stop, match="stop the fill"):
        pinstage.cache.put(ckpt, progress=stop)
    assert [p.name for p in cache_dir.iterdir() if p.name.startswith(".")] == []
    assert entries(cache_dir) == [] and pinstage.cache.lookup(ckpt)["state"] == "miss"


def test_a_fill_past_max_bytes_is_refused_and_leaves_nothing(ckpt, cache_dir):
    with pytest.raises(pinstage.Error, match="max|limit") as e:
        pinstage.cache.put(ckpt, max_bytes=ckpt.stat().st_size // 2)
    assert e.value.code == "out_of_memory"
    assert entries(cache_dir) == []


def test_bad_arguments_are_refused_by_name(ckpt, cache_dir, tmp_path):
    with pytest.raises(TypeError, match=r"put\(\): path must be str"):
        pinstage.cache.put(3)
    with pytest.raises(TypeError, match=r"info\(\): dir must be str"):
        pinstage.cache.info(dir=3)
    with pytest.raises(TypeError, match="progress must be a callable"):
        pinstage.cache.put(ckpt, progress=1)
    with pytest.raises(pinstage.InvalidArgumentError, match="max_bytes=0 leaves no room"):
        pinstage.cache.put(ckpt, max_bytes=0)
    with pytest.raises(TypeError, match=r"prune\(\): max_bytes must be int"):
        pinstage.cache.prune(max_bytes=1.5)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"max_bytes must be in \[0, 2\*\*64\)"):
        pinstage.cache.prune(max_bytes=-1)
    with pytest.raises(pinstage.InvalidArgumentError, match="threads"):
        pinstage.cache.put(ckpt, threads=-1)
    with pytest.raises(pinstage.InvalidArgumentError, match="numa_node must be an int >= -1"):
        pinstage.cache.put(ckpt, numa_node=-2)
    with pytest.raises(pinstage.Error):
        pinstage.cache.put(tmp_path / "missing.safetensors")
    assert entries(cache_dir) == []


def test_a_directory_others_can_write_is_refused_naming_the_fix(ckpt, tmp_path):
    """The C++ checks, passed on: group/world bits (chmod 700) and a symlink."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="pinstage-test50-", dir=SHM))
    link = SHM / (d.name + "-link")
    try:
        d.chmod(0o770)
        with pytest.raises(pinstage.Error, match="chmod 700"):
            pinstage.cache.put(ckpt, dir=d)
        assert list(d.iterdir()) == []
        d.chmod(0o700)
        link.symlink_to(d)
        with pytest.raises(pinstage.Error, match="symbolic link"):
            pinstage.cache.info(dir=link)
    finally:
        link.unlink(missing_ok=True)
        shutil.rmtree(d)


def test_cache_pyi_matches_the_module():
    """pinstage.cache's stub lists exactly its public functions, with their parameters,
    kinds and defaults (test_py_stubs covers __init__.pyi only)."""
    stub = ast.parse(pathlib.Path(pinstage.cache.__file__).with_suffix(".pyi").read_text())
    stubbed = {f.name: f for f in stub.body if isinstance(f, ast.FunctionDef)}
    public = {n for n, v in vars(pinstage.cache).items()
              if inspect.isfunction(v) and not n.startswith("_")}
    assert set(stubbed) == public
    for name, f in stubbed.items():
        a = f.args
        want = [(x.arg, None) for x in a.args[:len(a.args) - len(a.defaults)]]
        want += [(x.arg, ast.literal_eval(d)) for x, d in
                 zip(a.args[len(a.args) - len(a.defaults):], a.defaults)]
        want += [(x.arg, ast.literal_eval(d)) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
        got = [(n, None if p.default is inspect.Parameter.empty else p.default)
               for n, p in inspect.signature(getattr(pinstage.cache, name)).parameters.items()]
        assert want == got, name


# ---- pinstage.distributed: one filler per node ----

def shm_names():
    return set(os.listdir(SHM))


def test_two_ranks_of_a_node_fill_once_and_both_map_the_sources_bytes(tmp_path, build_dir):
    """torchrun, 2 ranks on this node: exactly one rank fills (state "filled", filler),
    the other waits and finds the entry ("hit"), proved by latches, not clocks
    (cache_rank.py): it starts waiting at the fill's barrier while the filler, blocked
    inside its fill, holds a lock, and finds the lock free when its lookup starts. Both load the source's bytes from the
    entry (map mode, "hit") and load_sharded(cache="use") hits too; a filler made to fail
    is named on both ranks, and a refill is again done by one rank. /dev/shm holds
    nothing new afterwards but the cache directory, which holds only the entry."""
    from test_distributed import LOCK, needs_torchrun, pd, torchrun
    if needs_torchrun.args[0]:
        pytest.skip(needs_torchrun.kwargs["reason"])
    model, plan = tp_checkpoint.write_checkpoint(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "started")  # the latches of cache_rank.py
    os.mkfifo(out / "release")
    d = pathlib.Path(tempfile.mkdtemp(prefix="pinstage-test50-", dir=SHM))
    try:
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # torchrun's port and /dev/shm, one suite at a time
            before = shm_names()
            os.environ["PINSTAGE_CACHE_DIR"] = str(d)
            try:
                torchrun(build_dir, 2, HERE / "cache_rank.py", model, plan, out)
            finally:
                del os.environ["PINSTAGE_CACHE_DIR"]
            after = shm_names()
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        fills = sorted((r["fill"]["state"], r["fill"]["filler"]) for r in ranks)
        assert fills == [("filled", True), ("hit", False)], fills
        assert ranks[0]["fill"]["filler"], "local rank 0 fills"
        # The filler filled under the lock; the other rank found it held as it began to
        # wait (the filler mid-fill) and free as it looked up (the fill over).
        assert ranks[0]["events"] == [["put_end", True], ["lookup_start", True]], ranks[0]
        assert ranks[1]["events"] == [["waits", False], ["lookup_start", True]], \
            f"the other rank did not wait for the fill: {ranks[1]['events']}"
        assert ranks[1]["released"] == "barrier", ranks[1]
        for r in ranks:
            assert r["load"] == {"cache": "hit", "cache_entry": r["fill"]["entry_path"],
                                 "names": True, "equal": True}, r
            assert r["sharded_cache"] == "hit"
            assert r["failure"] == {"phase": "cache fill", "ranks": [0]}, r
            assert r["after_failure"] == "miss", r
        assert sorted(r["refill"]["state"] for r in ranks) == ["filled", "hit"]
        # What pinstage could leave there: a distributed segment, the default cache
        # directory (the job names its own). Other processes of this machine (another
        # suite's tests) may add files of their own meanwhile, so only these are checked.
        ours = [n for n in after - before
                if n.startswith(pd.SHM_PREFIX) or n == f"pinstage-{os.geteuid()}"]
        assert ours == [], f"left in /dev/shm: {ours}"
        key = pathlib.Path(ranks[0]["fill"]["entry_path"]).name
        assert entries(d) == [key], entries(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
