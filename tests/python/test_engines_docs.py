"""Every ```python block of docs/engines.md runs where its engine is installed: each block
is marked `<!-- engine: NAME -->` (vllm, transformers, sglang) and runs as its own script in
a scratch folder holding model/, a tiny random Qwen3 saved with save_pretrained. A block
whose engine is absent is skipped, except under PINSTAGE_REQUIRE_ENGINES=1 (the engines
venv, scripts/engines-check.sh), where vLLM and transformers must be there. SGLang is in
no venv here (docs/engines.md says why), so its recipe is skipped everywhere."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "engines.md"
BLOCK = re.compile(r"^(?:<!-- engine: (?P<engine>\w+) -->\n)?```python\n(?P<body>.*?)^```",
                   re.S | re.M)
REQUIRED = os.environ.get("PINSTAGE_REQUIRE_ENGINES") == "1"
NEVER_HERE = {"sglang": "SGLang is in no venv here (docs/engines.md, SGLang)"}


def blocks():
    text = DOC.read_text()
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("body"))
        yield pytest.param(m.group("engine"), m.group("body"), id=f"engines.md:{line}")


def test_every_block_names_its_engine():
    found = [engine for engine, _ in (p.values for p in blocks())]
    assert found and None not in found, "a python block of docs/engines.md lacks its marker"
    assert {"vllm", "transformers", "sglang"} <= set(found)


@pytest.mark.parametrize("engine, body", list(blocks()))
def test_engine_blocks_run(engine, body, tmp_path, build_dir):
    if engine in NEVER_HERE:
        pytest.skip(NEVER_HERE[engine])
    if importlib.util.find_spec(engine) is None:
        if REQUIRED:
            pytest.fail(f"{engine} is not installed, and PINSTAGE_REQUIRE_ENGINES=1")
        pytest.skip(f"{engine} is not installed")
    if engine == "transformers":
        import torch
        import transformers
        torch.manual_seed(0)
        transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)).save_pretrained(
                tmp_path / "model", max_shard_size="100KB")
    script = tmp_path / "example.py"
    script.write_text(body)
    env = dict(os.environ, PYTHONPATH=str(build_dir / "python"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{engine} block:\n{body}\nstderr:\n{proc.stderr[-4000:]}"
