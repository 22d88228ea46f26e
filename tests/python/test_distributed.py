"""pinstage.distributed under torchrun (issue 27): 2 and 4 ranks with Gloo over sim, each
loading its tensor-parallel slices of a sharded checkpoint both ways ("own-slices",
"once-per-node"), checked against numpy in every rank (distributed_rank.py); here: the
gathered xxh3 digests against a single-process reference, the bytes each rank read (its
own slices only; once per node, every file read by exactly one rank), the thread share
each rank recorded, and a rank made to fail named on every rank with no pinned memory and
no /dev/shm segment left, a dead process's stale segment swept. Each job is bounded by a
subprocess timeout. The docs' torchrun example runs here too (docs/distributed.md)."""
import fcntl
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

import tp_checkpoint

torch = pytest.importorskip("torch")
import pinstage  # noqa: E402
from pinstage import distributed as pd  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
TORCHRUN = "/usr/bin/torchrun"
# Debian's torch 1.13 on Python 3.11 cannot parse torchrun's default --redirects/--tee
# ("0"); 2 (stderr to a log file, teed back) parses everywhere.
LAUNCH = ["--standalone", "--redirects", "2", "--tee", "2", "--monitor_interval", "0.1"]

needs_torchrun = pytest.mark.skipif(not os.path.exists(TORCHRUN) or
                                    not torch.distributed.is_available(),
                                    reason="needs /usr/bin/torchrun and torch.distributed")


# These tests use what the whole machine shares: --standalone's rendezvous port
# (localhost:29400) and /dev/shm, where they plant a stale segment and then check that none
# is left. Two suites at once (scripts/test.sh runs two) take turns, a test at a time,
# through this lock instead of failing with "Address already in use" or on the other's
# segment.
LOCK = pathlib.Path(tempfile.gettempdir()) / "pinstage-test-distributed.lock"


@pytest.fixture(autouse=True)
def one_suite_at_a_time():
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def torchrun(build_dir, nproc, *args, timeout=100, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "PINSTAGE_NUM_THREADS"}
    env["PYTHONPATH"] = str(build_dir / "python")
    done = subprocess.run([TORCHRUN, *LAUNCH, f"--nproc_per_node={nproc}", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def our_segments():
    return sorted(n for n in os.listdir(pd.SHM_DIR) if n.startswith(pd.SHM_PREFIX))


def expected(nproc):
    """{tp rank: {name: (xxh3, nbytes)}} from numpy, in this one process."""
    return {r: {n: (pinstage.xxh3_64(tp_checkpoint.expected_slice(n, nproc, r).tobytes()),
                    tp_checkpoint.expected_slice(n, nproc, r).nbytes)
                for n in tp_checkpoint.arrays()}
            for r in range(nproc)}


@needs_torchrun
@pytest.mark.parametrize("nproc", [2, 4])
def test_ranks_load_their_slices_both_ways_and_a_failure_is_named_everywhere(
        nproc, tmp_path, build_dir):
    model, plan = tp_checkpoint.write_checkpoint(tmp_path)
    stale = pathlib.Path(pd.SHM_DIR) / f"{pd.SHM_PREFIX}{dead_pid()}-killedjob-0"
    stale.write_bytes(b"left by a killed rank")
    out = tmp_path / "out"
    out.mkdir()
    try:
        torchrun(build_dir, nproc, HERE / "distributed_rank.py", model, plan, out, 1)
    finally:
        swept = not stale.exists()
        stale.unlink(missing_ok=True)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    want = expected(nproc)
    files = sorted(str(p) for p in model.glob("*.safetensors"))
    file_bytes = {f: sum(a.nbytes for n, (a, _) in tp_checkpoint.arrays().items()
                         if json.loads((model / "model.safetensors.index.json").read_text())
                         ["weight_map"][n] == pathlib.Path(f).name) for f in files}
    total = sum(file_bytes.values())
    for rec in ranks:  # each rank's share of the node's cores, and the pool it started
        share = max(1, rec["cpus"] // nproc) if rec["cpus"] >= (os.cpu_count() or 1) \
            else rec["cpus"]
        assert (rec["threads"], rec["pool_threads"], rec["threads_from"]) == \
            (share, share, "share"), rec
    for rec in ranks:  # 4 devices on 2 sockets: a block each, the worker on the first
        block = 4 // nproc
        assert rec["devices"] == list(range(rec["rank"] * block, (rec["rank"] + 1) * block))
        assert rec["device_id"] == rec["devices"][0]
        assert rec["device_numa_node"] == (0 if rec["device_id"] < 2 else 1)
    assert sum(r["threads"] for r in ranks) <= max(ranks[0]["cpus"], nproc)
    for mode in pd.READ_MODES:
        got = ranks[0]["modes"][mode]
        gathered = {tp_rank: d for tp_rank, d in got["digests"]}
        assert gathered == {r: {n: x for n, (x, _) in want[r].items()} for r in want}, mode
        reports = got["reports"]
        assert [r["rank"] for r in reports] == list(range(nproc))
        for r in reports:
            mine = sum(b for _, b in want[r["tp_rank"]].values())
            assert r["host_bytes"] == r["upload_bytes"] == mine, (mode, r)
            assert r["checkpoint_bytes"] == total
        if mode == "own-slices":
            for r in reports:
                assert r["read_bytes"] == r["host_bytes"], "a rank reads its own bytes only"
                assert r["copied_bytes"] == 0
        else:
            readers = {}
            for r in reports:
                for f, b in r["files_read"].items():
                    readers.setdefault(f, []).append((r["rank"], b))
                assert r["copied_bytes"] == r["host_bytes"]
            assert sorted(readers) == files, "every file read"
            assert all(len(v) == 1 for v in readers.values()), f"a file read twice: {readers}"
            assert {f: v[0][1] for f, v in readers.items()} == file_bytes
            assert sum(r["read_bytes"] for r in reports) == total, "the node read it once"
        assert all(rec["modes"][mode]["pinned_after_close"] == 0 for rec in ranks)
    for rec in ranks:  # rank 1 failed while the round's segments existed
        f = rec["failure"]
        assert f is not None and f["ranks"] == [1] and f["phase"] == "copy 0", rec
        assert "rank 1: RuntimeError: injected fault in phase 'copy 0'" in f["message"]
        assert rec["after_failure"] == {"pinned_bytes": 0, "device_bytes": 0}
        assert rec["shm_after"] == [], "no segment left by the failed load"
    assert swept, "the killed rank's segment was swept"
    assert our_segments() == []


DOC = ROOT / "docs" / "distributed.md"


def doc_blocks():
    """(the python example, the shell command line that starts it) of docs/distributed.md."""
    text = DOC.read_text()
    python = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(python) == 1, "docs/distributed.md has one python block: the torchrun example"
    shell = re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
    assert len(shell) == 1, "docs/distributed.md has one sh block: the command that starts it"
    return python[0], shell[0]


@needs_torchrun
def test_the_docs_torchrun_example_runs_as_written(tmp_path, build_dir):
    """Issue 49: the docs' own command line, `torchrun ... load_tp.py`, run by bash in a
    folder where build/ is the build under test, with `torchrun` this interpreter's
    torch.distributed.run (Debian's torch 1.13 or the venv's torch 2.x)."""
    code, command = doc_blocks()
    assert len(code.splitlines()) <= 20, "the example is 20 lines at most"
    assert "torchrun" in command and "load_tp.py" in command, command
    tp_checkpoint.write_checkpoint(tmp_path)  # model/ and plan.json, which the script reads
    (tmp_path / "load_tp.py").write_text(code)
    (tmp_path / "build").symlink_to(build_dir)
    shim = tmp_path / "bin" / "torchrun"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PINSTAGE_NUM_THREADS", "PYTHONPATH")}
    env["PATH"] = f"{shim.parent}:{env['PATH']}"
    done = subprocess.run(["bash", "-e", "-c", command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "rank 0 of 2: own slices" in done.stdout, done.stdout
    assert "rank 0 of 2: once per node" in done.stdout, done.stdout


# ---- pieces, in this process ----

def test_devices_are_split_in_blocks_or_shared_round_robin():
    assert pd.local_devices(list(range(8)), 1, 2) == [4, 5, 6, 7]
    assert pd.local_devices(list(range(8)), 7, 8) == [7]
    assert pd.local_devices([0], 3, 4) == [0]
    assert pd.local_devices([0, 1], 3, 4) == [1]


def test_eight_ranks_of_a_node_share_its_cores():
    assert pd.thread_share(64, 8, 64) == 8
    assert pd.thread_share(2, 4, 2) == 1
    assert pd.thread_share(8, 8, 64) == 8, "a mask narrowed by the launcher is the rank's own"


def test_the_sweep_removes_dead_owners_segments_only(tmp_path):
    dead = tmp_path / f"{pd.SHM_PREFIX}{dead_pid()}-job-0"
    live = tmp_path / f"{pd.SHM_PREFIX}{os.getpid()}-job-0"
    other = tmp_path / "someone-else"
    for p in (dead, live, other):
        p.write_bytes(b"x")
    assert pd.sweep_stale_segments(str(tmp_path)) == [dead.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_bad_calls_are_refused_by_name(monkeypatch):
    with pytest.raises(pinstage.InvalidArgumentError, match="read must be one of"):
        pd.load_sharded("model", {}, read="twice")
    with pytest.raises(pinstage.InvalidArgumentError, match="torch.distributed is not "
                                                            "initialised"):
        pd.setup()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(pinstage.InvalidArgumentError, match=r"RANK='x' is not a whole number"):
        pd._env_int("RANK", 0)
    monkeypatch.delenv("RANK")
    with pytest.raises(pinstage.InvalidArgumentError, match="RANK is not set; start the "
                                                            "processes with torchrun"):
        pd._env_int("RANK", 0)
    with pytest.raises(TypeError, match="plan must be a dict"):
        pd._plan_text(3)
    with pytest.raises(pinstage.InvalidArgumentError, match="tp plan '/nonexistent': cannot "
                                                            "read it"):
        pd._plan_text("/nonexistent")


def test_the_bindings_refuse_memory_that_does_not_fit(tmp_path, worker):
    model, plan = tp_checkpoint.write_checkpoint(tmp_path)
    c = pinstage._pinstage._Checkpoint(str(model))
    text = plan.read_text()
    names = [n for n in c.keys() if c.info(n)["file"] == c.files[0]]
    big = c.info(names[0])["nbytes"]
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=f"read_whole_into: tensor '{re.escape(names[0])}' "
                             f"\\({big} bytes at offset 1\\) does not fit the memory's "
                             f"{big} bytes"):
        pinstage._pinstage._read_whole_into(c, names[:1], bytearray(big), [1])
    with pytest.raises(pinstage.InvalidArgumentError,
                       match="read_whole_into: two tensors overlap at offset 0"):
        pinstage._pinstage._read_whole_into(c, names[:2], bytearray(4 * big), [0, 0])
    with pytest.raises(pinstage.InvalidArgumentError, match="read_tp_into: 0 buffers for "):
        pinstage._pinstage._read_tp_into(c, text, "(test)", 2, 0, [])
    slices = pinstage._pinstage._tp_slices(c, text, "(test)", 2, 0)
    small = [worker.alloc_pinned_host(1) for _ in slices]
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=f"read_tp_into: the buffer for tensor "
                             f"'{re.escape(slices[0]['name'])}' has 1 bytes; its slice needs "
                             f"{slices[0]['nbytes']}"):
        pinstage._pinstage._read_tp_into(c, text, "(test)", 2, 0, small)
    with pytest.raises(pinstage.InvalidArgumentError,
                       match="tp plan '\\(test\\)': its \"format\" is not"):
        pinstage._pinstage._tp_slices(c, "{}", "(test)", 2, 0)
    for b in small:
        b.close()


def test_setup_refuses_a_thread_pool_fixed_before_it(tmp_path, build_dir):
    """A process that loaded before setup() has its pool's size: setup() says so rather
    than run every rank on all cores."""
    code = f"""
import os, torch.distributed as dist, pinstage
from pinstage import distributed as pd
pinstage._pinstage.default_thread_count()       # the pool's size is fixed here
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="64")
dist.init_process_group("gloo", init_method="file://{tmp_path}/rdv", rank=0, world_size=1)
try:
    pd.setup()
except pinstage.InvalidArgumentError as e:
    print(e)
"""
    env = {k: v for k, v in os.environ.items() if k != "PINSTAGE_NUM_THREADS"}
    env["PYTHONPATH"] = str(build_dir / "python")
    done = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    cpus = pinstage._pinstage.usable_cpu_count()
    assert (f"this process fixed its thread count at {cpus} before setup() could set its "
            f"share (1 of {cpus} CPUs for 64 local ranks)") in done.stdout, done.stdout
