"""`pinstage load` and `pinstage bench load`: totals and JSON with exact bytes, bad input
refused before any work with a message naming it, a corrupt tensor named by --verify."""
import json
import subprocess

import pytest
import torch

from test_py_checkpoint import write_file

pytestmark = pytest.mark.once  # the CLI's: the same on any torch, run in one pass (pyproject.toml)


def run(cli, *args):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def small(tmp_path):
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.arange(1000, dtype=torch.float32), "b": torch.zeros(0, 3),
                      "c": torch.arange(7, dtype=torch.int16)})
    return path


def test_load_host_and_device_report_exact_bytes(cli, tmp_path):
    path = small(tmp_path)
    for to in ("host", "device"):
        p = run(cli, "load", path, "--to", to, "--json", "-", "--quiet", "--threads", "3",
                "--chunk-mib", "1")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["bytes"] == 4000 + 14 and doc["tensors"] == 3 and doc["files"] == 1
        assert doc["to"] == to and doc["threads"] == 3
        assert doc["run"]["options"]["--to"] == to
        if to == "device":
            assert doc["ring_pinned_bytes"] == 64 << 20
    p = run(cli, "load", path)
    assert p.returncode == 0 and "loaded 3 tensors, 4.01 kB (4,014 bytes)" in p.stdout, p.stdout


def test_load_refuses_bad_input_before_work(cli, tmp_path):
    path = small(tmp_path)
    p = run(cli, "load", path, "--chunk-mib", "0")
    assert p.returncode != 0 and "--chunk-mib='0' is not valid: must be in [1, 4096]" in p.stderr
    p = run(cli, "load", tmp_path / "missing")
    assert p.returncode != 0 and "missing': no such file or directory" in p.stderr
    p = run(cli, "load", path, "--json", "/dev/null")
    assert p.returncode != 0 and "not a regular file" in p.stderr
    p = run(cli, "load", path, "--to", "gpu")
    assert p.returncode != 0 and "gpu" in p.stderr


def test_load_verify_names_the_corrupt_tensor(cli, tmp_path):
    out = tmp_path / "ckpt"
    p = run(cli, "fixture", "qwen3-decode", "--layers", "1", "--seq-len", "16", "--out", out,
            "--shard-size", "256M", "--quiet")
    assert p.returncode == 0, p.stderr
    assert run(cli, "load", out, "--verify").returncode == 0
    shard = sorted(out.glob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__" and header[k]["data_offsets"][1] > 0)
    raw[8 + n + header[name]["data_offsets"][0]] ^= 1
    shard.write_bytes(bytes(raw))
    p = run(cli, "load", out, "--verify", "--to", "device")
    assert p.returncode == 1
    assert f"tensor '{name}' fails its integrity check" in p.stderr, p.stderr


def test_bench_load_runs_every_arm(cli, tmp_path):
    path = small(tmp_path)
    p = run(cli, "bench", "load", path, "--rounds", "1", "--json", "-", "--quiet")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    arms = {k.split("/")[0] for k in doc["arms"]}
    assert arms == {"a_read_then_copy", "b_mmap_copy", "c_pinstage_host", "c_first_load",
                    "d_pinstage_device", "raw_pread", "prefault_floor", "memcpy_all_cores",
                    "upload_alone"}
    assert "drop_took_effect" in doc["arms"]["c_pinstage_host/cold"]
    assert set(doc["targets"]) >= {"warm_c_over_memcpy_speed", "warm_c_alloc_share",
                                   "first_load_over_floors_time", "warm_c_over_a_speed",
                                   "cold_c_over_raw_pread_speed",
                                   "warm_d_over_max_read_upload_time"}
    # Every target carries its goal and a verdict that agrees with the value.
    for key, t in doc["targets"].items():
        assert set(t) == {"value", "goal", "at_least", "met"}, key
        assert t["met"] == (t["value"] >= t["goal"] if t["at_least"] else t["value"] <= t["goal"])


def test_cli_and_python_load_reports_share_one_set_of_keys(cli, tmp_path, worker):
    """One serialiser (report_fields): the CLI's `load --json` and Python's device-load
    report say the same keys, in the same order, with the same counts."""
    import pinstage
    path = small(tmp_path)
    p = run(cli, "load", path, "--to", "device", "--json", "-", "--quiet",
            "--verify=if-present")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    dev = pinstage.load_to_device(path, worker=worker, verify="if-present")
    try:
        py = dev.report
    finally:
        dev.close()
    cli_keys = [k for k in doc if k not in ("run", "path", "layout", "to")]
    # sim's device first touch (issue 42) is in the C++ LoadReport since issue 49: the CLI's
    # keys end with it too, and both are report_fields in its order.
    extra = ["device_first_touch_bytes", "device_first_touch_s", "device_first_touch_reason"]
    assert cli_keys[-len(extra):] == extra, cli_keys
    assert cli_keys == list(py), (cli_keys, list(py))
    for key in ("bytes", "tensors", "files", "verified", "unverified", "ring_pinned_bytes"):
        assert doc[key] == py[key], key
    assert (doc["unverified"], doc["verified"]) == (3, False)
