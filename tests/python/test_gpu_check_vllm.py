"""scripts/gpu-check-vllm.sh, gpu-check.sh's vLLM step, on a fake `vllm` (no GPU here): it
writes the small model, declares pinstage's entry point where pinstage is not installed,
serves each load format in turn and stops each run (its whole process group) once vLLM
reports the model loaded, and tabulates the load times; a format that fails is reported
with its log's end and fails the step; with no interpreter named it says skipped. The
GPU run itself is gpu-check.sh's, on the first GPU lent (docs/engines.md, "On a GPU")."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEP = ROOT / "scripts" / "gpu-check-vllm.sh"
HELPER = ROOT / "scripts" / "lib" / "vllm_check.py"

# A `vllm` that logs vLLM's two lines, records its arguments, PYTHONPATH and the pid of
# the child it leaves running, then waits to be stopped; "pinstage" fails if FAIL is set.
FAKE = r"""#!/bin/bash
fmt=$4
echo "$* | $PYTHONPATH" >> "$RECORD/args"
if [ "$fmt" = pinstage ] && [ -n "${FAIL:-}" ]; then
  echo "ValueError: Unexpected extra config keys for load format pinstage"; exit 1
fi
sleep 600 & echo $! >> "$RECORD/children"
echo "INFO Loading weights took 0.4$RANDOM seconds"
echo "INFO Model loading took 1.02 GiB memory and 2.50 seconds"
wait
"""


def helper():
    spec = importlib.util.spec_from_file_location("vllm_check", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake(tmp_path, build_dir):
    """(environment, record folder): a fake vllm and a `vllm` package that imports."""
    (tmp_path / "pkgs" / "vllm").mkdir(parents=True)
    (tmp_path / "pkgs" / "vllm" / "__init__.py").write_text("")
    exe = tmp_path / "vllm"
    exe.write_text(FAKE)
    exe.chmod(0o755)
    record = tmp_path / "record"
    record.mkdir()
    env = dict(os.environ, OUT=str(tmp_path / "out"), RECORD=str(record),
               PINSTAGE_CHECK_VLLM_PYTHON=sys.executable, PINSTAGE_CHECK_VLLM=str(exe),
               PINSTAGE_CHECK_VLLM_MODEL="256 1",
               PYTHONPATH=f"{tmp_path / 'pkgs'}:{build_dir / 'python'}")
    (tmp_path / "out").mkdir()
    return env, record


def run(env, seconds=120):
    return subprocess.run(["bash", str(STEP), str(seconds)], env=env, capture_output=True,
                          text=True, timeout=300)


def alive(pid):
    return pathlib.Path(f"/proc/{pid}").exists() and \
        "zombie" not in pathlib.Path(f"/proc/{pid}/status").read_text().lower()


def test_each_format_is_served_stopped_and_tabulated(fake):
    env, record = fake
    done = run(env)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (record / "args").read_text().splitlines()
    assert [c.split()[3] for c in calls] == ["safetensors", "fastsafetensors", "pinstage"]
    assert all(c.startswith("serve ") and "--skip-tokenizer-init" in c for c in calls)
    # pinstage is not installed here: the step declared its entry point on PYTHONPATH.
    plugin = pathlib.Path(calls[2].split(" | ")[1].split(":")[0])
    ep = next(plugin.glob("*.dist-info")) / "entry_points.txt"
    assert "pinstage = pinstage.vllm:register" in ep.read_text()
    for pid in (record / "children").read_text().split():
        assert not alive(int(pid)), "a vllm run's process outlived the step"
    out = pathlib.Path(env["OUT"])
    table = json.loads((out / "vllm.json").read_text())
    assert sorted(table) == ["fastsafetensors", "pinstage", "safetensors"]
    assert all(r["model_s"] == 2.5 and r["model_gib"] == 1.02 for r in table.values())
    assert "pinstage" in (out / "vllm.txt").read_text()
    assert not (out / "vllm-model").exists()  # the model is removed once served


def test_a_format_that_fails_fails_the_step_and_shows_its_log(fake):
    env, _ = fake
    done = run(dict(env, FAIL="1"))
    assert done.returncode == 1
    assert "--load-format pinstage did not load the model" in done.stdout
    assert "Unexpected extra config keys" in done.stdout  # the log's end
    table = json.loads((pathlib.Path(env["OUT"]) / "vllm.json").read_text())
    assert table["pinstage"]["model_s"] is None and table["safetensors"]["model_s"] == 2.5


def test_no_time_left_is_a_failure_not_a_hang(fake):
    env, record = fake
    done = run(env, seconds=30)  # 10 s a format: under the 20 s a run needs
    assert done.returncode == 1 and "no time left for --load-format safetensors" in done.stdout
    assert not (record / "args").exists()


def test_skipped_without_an_interpreter_or_without_vllm(fake, tmp_path):
    env, record = fake
    done = run({k: v for k, v in env.items() if k != "PINSTAGE_CHECK_VLLM_PYTHON"})
    assert done.returncode == 0 and "vllm: skipped: set PINSTAGE_CHECK_VLLM_PYTHON" in done.stdout
    done = run(dict(env, PYTHONPATH=str(tmp_path)))  # neither vllm nor pinstage importable
    assert done.returncode == 0 and "cannot import vllm and pinstage" in done.stdout
    assert not (record / "args").exists()


def test_the_model_is_a_llama_checkpoint_pinstage_opens(tmp_path, worker):
    import pinstage
    helper().model(tmp_path, 256, 2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    tensors = pinstage.load_file(tmp_path, worker=worker, mode="map")
    assert len(tensors) == 2 * 9 + 3
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    assert list(q.shape) == [256, 256] and bool(q.float().abs().max() < 0.04)
