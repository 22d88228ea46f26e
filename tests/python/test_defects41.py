"""Issue 41's defects, each as the user met it: a crash on a long name under a regex plan
rule, a stale hash sidecar, a missing shard, negative thread counts, an interrupted sharded
fixture, raw pybind11 errors, misleading messages, case-sensitive choices and bench compare
of reports it cannot compare."""
import gc
import json
import os
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

import pinstage


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}; no hashes recorded (a Hugging Face file)."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def cli_run(cli, *args, cwd=None, timeout=300):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


# ---- 1: a regex plan rule on a long name ----

def test_a_regex_rule_matches_a_million_character_name_without_crashing(tmp_path, worker):
    name = "m." + "x" * 1_000_000
    write_safetensors(tmp_path / "m.safetensors",
                      {name: ("U8", [4, 2], bytes(range(8))), "other": ("U8", [2], b"ab")})
    plan = {"format": "pinstage.tp_plan/1", "rules": [{"regex": "m\\..*", "split": 0}]}
    load = pinstage.load_tp(str(tmp_path / "m.safetensors"), 2, plan, worker=worker,
                            framework="np")
    assert load.ranks[0][name].tobytes() == bytes(range(4))
    assert load.ranks[1][name].tobytes() == bytes(range(4, 8))
    assert load.ranks[1]["other"].tobytes() == b"ab"  # no rule matched: replicated
    del load


def test_the_cli_loads_a_long_name_under_a_regex_rule(cli, tmp_path):
    name = "m." + "y" * 200_000
    write_safetensors(tmp_path / "m.safetensors", {name: ("U8", [4], bytes(4))})
    (tmp_path / "plan.json").write_text(json.dumps(
        {"format": "pinstage.tp_plan/1", "rules": [{"regex": "m\\.y+", "split": 0}]}))
    done = cli_run(cli, "load", tmp_path / "m.safetensors", "--tp", 2, "--plan",
                   tmp_path / "plan.json")
    assert done.returncode == 0, done.stderr


# ---- 6: a stale hash sidecar ----

def test_hash_replaces_its_stale_sidecar_and_verify_names_it_stale(cli, tmp_path):
    ckpt = tmp_path / "hf.safetensors"
    write_safetensors(ckpt, {"w": ("U8", [4096], bytes(range(256)) * 16)})
    assert cli_run(cli, "hash", ckpt).returncode == 0
    os.replace(ckpt, tmp_path / "old")  # re-saved by its writer: new bytes, same layout
    write_safetensors(ckpt, {"w": ("U8", [4096], bytes(4096))})
    stale = cli_run(cli, "load", ckpt, "--verify")
    assert stale.returncode == 1
    assert "stale" in stale.stderr and f"pinstage hash {ckpt}" in stale.stderr, stale.stderr
    again = cli_run(cli, "hash", ckpt)
    assert again.returncode == 0, again.stderr
    ok = cli_run(cli, "load", ckpt, "--verify")
    assert ok.returncode == 0 and "matches the recorded one" in ok.stdout, ok.stderr


def test_bytes_changed_under_an_unchanged_identity_are_still_damage(cli, tmp_path):
    ckpt = tmp_path / "hf.safetensors"
    write_safetensors(ckpt, {"w": ("U8", [4096], bytes(range(256)) * 16)})
    assert cli_run(cli, "hash", ckpt).returncode == 0
    st = os.stat(ckpt)
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 1  # bit rot: same file, same size, same modification time
    with open(ckpt, "r+b") as f:
        f.write(bytes(data))
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))
    bad = cli_run(cli, "load", ckpt, "--verify")
    assert bad.returncode == 1 and "tensor 'w' fails its integrity check" in bad.stderr, bad.stderr


# ---- 7: a shard directory missing a shard ----

def test_a_shard_directory_missing_a_numbered_shard_is_refused(cli, tmp_path):
    for k in (1, 3):
        write_safetensors(tmp_path / f"model-0000{k}-of-00003.safetensors",
                          {f"t{k}": ("U8", [8], bytes(8))})
    done = cli_run(cli, "load", tmp_path)
    assert done.returncode != 0
    assert "'model-00002-of-00003.safetensors'" in done.stderr and "missing" in done.stderr, \
        done.stderr


# ---- 8: negative thread counts ----

def test_negative_thread_counts_are_refused():
    with pytest.raises(pinstage.InvalidArgumentError, match="total"):
        pinstage.split_threads(-1, 2)
    with pytest.raises(pinstage.InvalidArgumentError, match="threads"):
        pinstage.WorkerGroup("sim", "all", threads=-1)


# ---- 9: an interrupted sharded fixture ----

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_sharded_fixture_leaves_only_the_users_files(cli, tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "model-00001-of-00009.safetensors").write_bytes(b"mine too")
    before = sorted(p.name for p in out.iterdir())
    proc = subprocess.Popen([str(cli), "fixture", "qwen3-decode", "--layers", "1", "--out",
                             str(out), "--shard-size", "64M", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    # Waits for the first finished shard of this run: an observed state, not a guess.
    while not any(p.name.startswith("model-00001-of-000") and p.name.endswith(".safetensors")
                  and p.name not in before for p in out.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "no shard was written"
        time.sleep(0.002)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    assert proc.returncode == -sig, proc.stderr.read()
    assert sorted(p.name for p in out.iterdir()) == before


# ---- 10: pybind11's raw errors ----

def test_out_of_range_ints_are_invalid_argument_errors_naming_the_argument(tmp_path, worker,
                                                                           alloc):
    import torch
    write_safetensors(tmp_path / "m.safetensors", {"w": ("U8", [8], bytes(range(8)))})
    with pinstage.safe_open(str(tmp_path / "m.safetensors"), "np", worker=worker) as f:
        got = f.get_slice("w")[0:7:2**63]
        assert np.asarray(got).tolist() == [0]  # NumPy's answer: the step passes the end
        assert np.asarray(f.get_slice("w")[1:8:2**70]).tolist() == [1]
        del got
    args = pinstage.TaskArgs()
    c = alloc.copy(torch.full((256,), 5, dtype=torch.uint8))
    args.add("c", c, "inout")
    with pinstage.ResidentBinder(worker, args, execute="sim.fill_index", check_writes=False) as rb:
        rb.step()
        with pytest.raises(pinstage.InvalidArgumentError, match="offset"):
            rb.download("c", -1, 1)
        with pytest.raises(pinstage.InvalidArgumentError, match="nbytes"):
            rb.download("c", 0, -1)
        with pytest.raises(pinstage.InvalidArgumentError, match="offset"):
            rb.download("c", 2**64, 1)
        # 11: one tensor named twice is said to be one tensor.
        with pytest.raises(pinstage.InvalidArgumentError, match="the same tensor"):
            rb.copy_on_device("c", "c")
    del args, c
    with pytest.raises(pinstage.InvalidArgumentError, match="total"):
        pinstage.split_threads(2**40, 2)
    with pytest.raises(pinstage.InvalidArgumentError, match="devices"):
        pinstage.split_threads(2, -1)
    with pytest.raises(pinstage.InvalidArgumentError, match="data"):
        pinstage.xxh3_64(2**64)


# ---- Also: finalize() with a DLPack view of a DeviceBuffer alive ----

def test_finalize_names_a_device_buffer_as_a_device_buffer():
    w = pinstage.Worker()
    d = w.alloc_device(256)
    capsule = d.__dlpack__()
    with pytest.raises(BufferError) as e:
        w.finalize()
    assert "1 device buffer(s) still have 1 live view(s)" in str(e.value)
    assert "pinned buffer" not in str(e.value)
    del capsule, d
    gc.collect()
    w.finalize()


# ---- 12: choices are case-insensitive ----

def test_verify_and_devices_choices_are_case_insensitive(cli, tmp_path):
    ckpt = tmp_path / "m.safetensors"
    write_safetensors(ckpt, {"w": ("U8", [64], bytes(64))})
    assert cli_run(cli, "hash", ckpt).returncode == 0
    for verify in ("--verify=ALL", "--verify=IF-PRESENT", "--verify=If-Present"):
        done = cli_run(cli, "load", ckpt, verify)
        assert done.returncode == 0, (verify, done.stderr)
    done = cli_run(cli, "load", ckpt, "--devices", "ALL")
    assert done.returncode == 0, done.stderr


# ---- 13: bench compare of reports it cannot compare ----

@pytest.fixture(scope="module")
def load_report(cli, tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    write_safetensors(d / "m.safetensors", {"w": ("U8", [1 << 16], bytes(1 << 16))})
    done = cli_run(cli, "bench", "load", "m.safetensors", "--rounds", "1", "--no-cold", "-q",
                   "--json", "load.json", cwd=d)
    assert done.returncode == 0, done.stderr
    return d / "load.json"


def test_compare_names_a_load_report_it_cannot_compare(cli, load_report):
    done = cli_run(cli, "bench", "compare", load_report, load_report)
    assert done.returncode != 0
    assert "is a bench load report" in done.stderr and "config is missing" not in done.stderr, \
        done.stderr


def test_compare_names_a_steps_report_it_cannot_compare(cli, tmp_path):
    steps = {"kind": "steps", "steps": 2, "records": [], "run": {}}
    (tmp_path / "s.json").write_text(json.dumps(steps))
    done = cli_run(cli, "bench", "compare", tmp_path / "s.json", tmp_path / "s.json")
    assert done.returncode != 0
    assert "is a steps bench report" in done.stderr, done.stderr


# ---- Also: --json into /proc or /sys ----

@pytest.mark.parametrize("target", ["/proc/self/status", "/sys/kernel/pinstage.json",
                                    "/proc/pinstage.json"])
def test_json_into_proc_or_sys_is_refused_before_the_run(cli, target):
    start = time.monotonic()
    done = cli_run(cli, "bench", "synthetic", "--tensors", 2, "--bytes", 4096, "--groups", 1,
                   "--rounds", 2, "--no-baseline", "--no-plot", "-q", "--json", target)
    assert done.returncode != 0
    assert "--json" in done.stderr and "not a place for files" in done.stderr, done.stderr
