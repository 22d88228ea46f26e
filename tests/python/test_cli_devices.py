"""`--devices all|0,1` on the CLI (sim with `--backend-option devices=N`): `load --devices`
puts rank r of a tensor-parallel load on the r-th listed device, each device receiving the
bytes of numpy.array_split's slices, with every byte of the checkpoint read once; `bench load`
reports the same per device; `bench <task> --devices` adds a group bind with per-device and
aggregate GB/s; `scene --devices` runs on each device; one id picks that device on demo and
load. A bad list or a --tp unlike the device count fails before any work, naming the
option, and writes no report."""
import json
import subprocess

import numpy as np
import pytest

from tp_checkpoint import PLAN, SMALL, write_small_checkpoint

pytestmark = pytest.mark.once  # the CLI's: the same on any torch, run in one pass (pyproject.toml)

TENSORS = SMALL
TOTAL = sum(a.nbytes for a, _ in TENSORS.values())


def sim(n):
    return ["--backend-option", f"devices={n}"]


def run(cli, *args, cwd=None):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.fixture
def model(tmp_path):
    return write_small_checkpoint(tmp_path)


def rank_bytes(tp, rank):
    """Rank `rank`'s bytes as numpy cuts the tensors (a replicated tensor whole)."""
    total = 0
    for a, dim in TENSORS.values():
        total += a.nbytes if dim is None else np.array_split(a, tp, axis=dim % a.ndim)[rank].nbytes
    return total


def check_devices(devices, ids):
    tp = len(ids)
    assert [d["device"] for d in devices] == ids
    assert [d["rank"] for d in devices] == list(range(tp))
    for d in devices:
        assert d["bytes"] == rank_bytes(tp, d["rank"]), d
        assert d["tensors"] == len(TENSORS)
        assert d["upload_s"] >= 0 and d["upload_gbps"] >= 0


@pytest.mark.parametrize("n,devices,ids", [(2, "all", [0, 1]), (4, "all", [0, 1, 2, 3]),
                                           (3, "2,0", [2, 0]), (4, "1,3,0", [1, 3, 0])])
def test_load_puts_each_ranks_numpy_slices_on_its_device(cli, model, n, devices, ids):
    d, plan = model
    p = run(cli, "load", d, *sim(n), "--devices", devices, "--plan", plan, "--json", "-", "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["to"] == "devices" and doc["tp"] == len(ids)
    assert doc["read_bytes"] == doc["checkpoint_bytes"] == TOTAL
    check_devices(doc["devices"], ids)
    assert doc["uploaded_bytes"] == sum(x["bytes"] for x in doc["devices"])
    assert doc["scatter_bytes"] > 0  # the column and last-dim splits went through staging
    # The text says the same: one row per device, and the node's read and upload.
    p = run(cli, "load", d, *sim(n), "--devices", devices, "--plan", plan)
    assert p.returncode == 0, p.stderr
    assert f"read     {TOTAL:,} bytes of the checkpoint's {TOTAL:,}: every byte once" in p.stdout
    for rank, dev in enumerate(ids):
        assert any(line.split()[:3] == [str(dev), str(rank), f"{rank_bytes(len(ids), rank):,}"]
                   for line in p.stdout.splitlines()), p.stdout
    assert "GB/s aggregate" in p.stdout


def test_tp_equal_to_the_device_count_is_accepted_and_unequal_refused(cli, model, tmp_path):
    d, plan = model
    p = run(cli, "load", d, *sim(2), "--devices", "0,1", "--tp", 2, "--plan", plan, "--json", "-",
            "-q")
    assert p.returncode == 0, p.stderr
    check_devices(json.loads(p.stdout)["devices"], [0, 1])
    out = tmp_path / "out.json"
    for cmd in (["load"], ["bench", "load"]):
        p = run(cli, *cmd, d, *sim(2), "--devices", "all", "--tp", 3, "--plan", plan,
                "--json", out)
        assert p.returncode != 0
        assert "--tp 3" in p.stderr and "--devices 'all'" in p.stderr, p.stderr
        assert not out.exists()
    # A plan whose "tp" is not the device count, and --to host onto several devices.
    (tmp_path / "plan4.json").write_text(json.dumps({**PLAN, "tp": 4}))
    p = run(cli, "load", d, *sim(2), "--devices", "all", "--plan", tmp_path / "plan4.json")
    assert p.returncode != 0 and '"tp": 4' in p.stderr and "--devices 'all'" in p.stderr
    p = run(cli, "load", d, *sim(2), "--devices", "all", "--to", "host")
    assert p.returncode != 0 and "--to host" in p.stderr and "--devices" in p.stderr
    # Without --devices, --tp with --to device stays refused.
    p = run(cli, "load", d, "--tp", 2, "--to", "device")
    assert p.returncode != 0 and "--to device cannot be combined" in p.stderr


BAD = ["", "0,0", "9", "x", "0,,1", "1,", "-1", "0x1"]


def commands(d, plan):
    return [
        ["load", d, "--plan", plan],
        ["load", d],
        ["bench", "load", d, "--rounds", 1, "--no-cold"],
        ["bench", "synthetic", "--tensors", 1, "--bytes", 4096, "--groups", 1, "--rounds", 2,
         "--no-baseline", "--no-plot"],
        ["scene", "qwen3-decode", "--layers", 1, "--seq-len", 16],
        ["demo", "--mib", 1],
    ]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_device_list_fails_before_work_naming_the_option(cli, model, tmp_path, bad):
    d, plan = model
    out = tmp_path / "report.json"
    for args in commands(d, plan):
        p = run(cli, *args, *sim(2), "--devices", bad, "--json", out)
        assert p.returncode != 0, (args, bad)
        assert "--devices" in p.stderr, (args, bad, p.stderr)
        assert not out.exists(), (args, bad)


def test_one_id_picks_that_device(cli, model):
    d, _ = model
    p = run(cli, "demo", "--mib", 1, *sim(2), "--devices", 1, "--json", "-", "-q")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["device_id"] == 1
    p = run(cli, "demo", "--mib", 1, *sim(2), "--devices", "all")
    assert p.returncode != 0 and "demo runs on one device" in p.stderr
    p = run(cli, "load", d, *sim(3), "--devices", 2, "--to", "device", "--json", "-", "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["run"]["device"] == "sim device 2" and doc["bytes"] == TOTAL
    p = run(cli, "load", d, *sim(2), "--json", "-", "-q")  # no --devices: device 0
    assert p.returncode == 0 and json.loads(p.stdout)["run"]["device"] == "sim device 0"


def test_bench_load_reports_each_devices_read_and_upload(cli, model):
    d, plan = model
    p = run(cli, "bench", "load", d, *sim(3), "--devices", "all", "--plan", plan, "--rounds", 1,
            "--no-cold", "--json", "-", "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    t = doc["tp_devices"]
    assert t["tp"] == 3 and t["read_bytes"] == t["checkpoint_bytes"] == TOTAL
    check_devices(t["devices"], [0, 1, 2])
    shared = sum(a.nbytes for a, dim in TENSORS.values() if dim is None)
    for x in t["devices"]:
        assert x["bytes"] == x["direct_bytes"] + x["scatter_bytes"] + x["shared_bytes"]
        assert x["shared_bytes"] == shared
    assert t["uploaded_bytes"] == sum(x["bytes"] for x in t["devices"])
    assert "tp_devices/warm" in doc["arms"] and doc["tp"]["tp"] == 3
    p = run(cli, "bench", "load", d, *sim(2), "--rounds", 1, "--no-cold", "--json", "-", "-q")
    assert p.returncode == 0 and "tp_devices" not in json.loads(p.stdout)


def test_bench_group_bind_reports_each_device_and_the_aggregate(cli, tmp_path):
    out = tmp_path / "bench.json"
    p = run(cli, "bench", "synthetic", "--tensors", 2, "--bytes", 65536, "--groups", 1,
            "--rounds", 3, "--no-baseline", "--no-plot", *sim(3), "--devices", "2,0",
            "--json", out)
    assert p.returncode == 0, p.stderr
    g = json.loads(out.read_text())["group"]
    assert g["arm"] == "pinned" and g["devices"] == [2, 0] and g["rounds_used"] == 2
    assert [x["device"] for x in g["per_device"]] == [2, 0]
    for x in g["per_device"]:
        assert x["input_bytes"] == 2 * 65536
        assert len(x["upload_gbps"]) == 2 and x["median_upload_gbps"] > 0
    assert len(g["aggregate_upload_gbps"]) == 2 and g["median_aggregate_upload_gbps"] > 0
    # aggregate: both devices' bytes over the slower upload, so above each device's own rate
    for r in range(2):
        slowest = max(x["upload_s"][r] for x in g["per_device"])
        assert g["aggregate_upload_gbps"][r] == pytest.approx(2 * 2 * 65536 / slowest / 1e9,
                                                              rel=1e-6)
    assert "group bind, pinned arm on 2 devices at once" in p.stdout
    assert "aggregate" in p.stdout
    # One device: no group section, as before.
    p = run(cli, "bench", "synthetic", "--tensors", 1, "--bytes", 4096, "--groups", 1,
            "--rounds", 2, "--no-baseline", "--no-plot", *sim(2), "--devices", 1, "--json", "-",
            "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert "group" not in doc and doc["run"]["device"] == "sim device 1"


def test_scene_runs_on_each_listed_device(cli, tmp_path):
    out = tmp_path / "scene.json"
    p = run(cli, "scene", "qwen3-decode", "--layers", 1, "--seq-len", 16, *sim(2),
            "--devices", "1,0", "--json", out)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["ok"] and [x["device"] for x in doc["devices"]] == [1, 0]
    assert all(x["ok"] and x["rounds"][0]["ok"] for x in doc["devices"])
    assert "device 1" in p.stdout and "PASS on devices 1,0 (one after another)" in p.stdout
