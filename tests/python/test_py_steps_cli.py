"""`pinstage scene --steps` and `pinstage bench <scene> --steps`: the decode loop from the
CLI, its report and its refusals."""
import json
import subprocess

import pytest

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)


def run(cli, *args):
    return subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=300)


SMALL = ["--layers", "1", "--seq-len", "127"]


def test_scene_steps_report_each_step(cli):
    done = run(cli, "scene", "qwen3-decode", *SMALL, "--steps", "3", "--json", "-")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["steps"] == 3 and report["resident"] is True and report["ok"] is True
    moved = [r["uploaded_bytes"] for r in report["rounds"]]
    assert moved[0] > 1_000_000_000 and moved[1:] == [128, 128]
    assert "step 2:" in done.stderr and "17 stayed" in done.stderr
    full = run(cli, "scene", "qwen3-decode", *SMALL, "--steps", "2", "--full-bind", "--json", "-")
    assert full.returncode == 0, full.stderr
    rounds = json.loads(full.stdout)["rounds"]
    assert rounds[1]["uploaded_bytes"] == rounds[0]["uploaded_bytes"]


def test_bench_steps_prints_its_targets(cli, tmp_path):
    out = tmp_path / "steps.json"
    done = run(cli, "bench", "qwen3-decode", *SMALL, "--steps", "3", "--groups", "1",
               "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "target: staging >= 20x lower resident" in done.stdout
    assert "target: a resident step moves < 0.1% of a full bind's bytes" in done.stdout
    report = json.loads(out.read_text())
    assert report["kind"] == "steps" and report["steps"] == 3 and "run" in report
    records = report["records"]
    assert len(records) == 6 and {r["mode"] for r in records} == {"resident", "full"}
    resident2 = [r for r in records if r["mode"] == "resident" and r["step"] >= 2]
    assert all(r["uploaded_bytes"] == 128 for r in resident2)
    assert report["moved_fraction"] < 0.001


def test_bad_step_options_are_refused_before_work(cli):
    cases = [
        (["scene", "qwen3-decode", *SMALL, "--steps", "0"], "--steps"),
        (["scene", "qwen3-decode", *SMALL, "--steps", "2", "--rounds", "2"], "--rounds must be 1"),
        (["scene", "qwen3-decode", "--layers", "1", "--seq-len", "5500", "--steps", "2"],
         "steps must be in [1, 1]"),
        (["bench", "qwen3-decode", *SMALL, "--steps", "2", "--arms", "pinned"],
         "--arms belongs to the A/B benchmark"),
    ]
    for args, message in cases:
        done = run(cli, *args)
        assert done.returncode != 0, args
        assert message in done.stderr, (args, done.stderr)
