"""docs/loading.md's newcomer path ("A first load, step by step") runs top to bottom, as
one script, on a Hugging Face checkpoint written by huggingface_hub's own writer (the venv
pass has it): load with a report and progress=True, map mode, typed device tensors. It must
exit 0 and write nothing to stderr (the bar stays quiet off a terminal)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTION = re.compile(r"<!-- newcomer path: start -->(.*?)<!-- newcomer path: end -->", re.S)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def newcomer_blocks():
    text = (ROOT / "docs" / "loading.md").read_text()
    section = SECTION.search(text)
    assert section, "docs/loading.md lost its newcomer path markers"
    blocks = BLOCK.findall(section.group(1))
    assert len(blocks) >= 3, "the newcomer path has a load, map mode and the device"
    return blocks


def test_the_newcomer_path_is_load_report_map_and_typed_device_tensors():
    script = "\n".join(newcomer_blocks())
    for needle in ("report=True", "progress=True", 'mode="map"', "dev.tensor("):
        assert needle in script, needle


def test_the_newcomer_path_runs_on_a_huggingface_checkpoint(tmp_path, build_dir):
    hub = pytest.importorskip("huggingface_hub")
    torch = pytest.importorskip("torch")
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(64, 32).bfloat16()
             for i in range(3)}
    state["model.norm.weight"] = torch.ones(32)
    (tmp_path / "model").mkdir()
    hub.save_torch_state_dict(state, str(tmp_path / "model"), max_shard_size="8KB")
    assert (tmp_path / "model" / "model.safetensors.index.json").exists()
    env = dict(os.environ, PYTHONPATH=str(build_dir / "python"))
    done = subprocess.run([sys.executable, "-c", "\n".join(newcomer_blocks())], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert "nothing copied" in done.stdout and "uploaded" in done.stdout, done.stdout
