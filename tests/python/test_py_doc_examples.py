"""Every fenced ```python block of README.md and docs/*.md runs (issue 12): the blocks of
one file run in order as one script, in a scratch folder, against the build's module, and
must exit 0 without writing to stderr. Signatures and shell lines are fenced as ```text
or ```sh, so they are not run. A file that needs data gets it from SETUP; one that cannot
run here is listed in SKIP with the reason."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tp_checkpoint import write_safetensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("**/*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def tensors_setup(folder):
    write_safetensors(folder / "qwen3.safetensors", {"wq": ("BF16", [2, 2], bytes(8))})


def node_setup(folder):
    """model/ with a Hugging Face checkpoint's names (model.layers.N.self_attn.q_proj...)
    and plan.json as docs/node.md itself shows it: its example must use the names its plan
    and a real checkpoint use (issue 42: it looked up layers.0.q_proj.weight, a KeyError)."""
    import json

    text = (ROOT / "docs" / "node.md").read_text()
    plan = re.search(r"^```json\n(.*?)^```", text, re.S | re.M).group(1)
    (folder / "plan.json").write_text(json.dumps(json.loads(plan)))
    (folder / "model").mkdir()
    tensors = {"model.embed_tokens.weight": ("F32", [16, 8], bytes(16 * 8 * 4)),
               "model.norm.weight": ("F32", [8], bytes(8 * 4))}
    for i in range(2):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            tensors[f"model.layers.{i}.{part}.weight"] = ("BF16", [8, 8], bytes(8 * 8 * 2))
    write_safetensors(folder / "model" / "model.safetensors", tensors)


def cache_setup(folder):
    """model/ to cache, and a cache directory of the test's own on tmpfs (the default, in
    /dev/shm, would outlive the test): the environment the example runs with."""
    import tempfile
    (folder / "model").mkdir()
    write_safetensors(folder / "model" / "model.safetensors",
                      {"w": ("F32", [4, 4], bytes(64)), "b": ("BF16", [4], bytes(8))})
    return {"PINSTAGE_CACHE_DIR": tempfile.mkdtemp(prefix="pinstage-doc-", dir="/dev/shm")}


SETUP = {"docs/tensors.md": tensors_setup,
         "docs/node.md": node_setup,  # model/ with HF names and the doc's own plan.json
         "docs/cache-python.md": cache_setup}  # returns the environment to run with
SKIP = {
    "docs/loading.md": "needs a checkpoint folder model/ (its own tests cover loading)",
    "docs/distributed.md": "runs under torchrun: tests/python/test_distributed.py runs it",
    "docs/acl.md": "runs on the libascendcl double: tests/python/test_acl_docs42.py runs it",
    "docs/engines.md": "needs the engines: tests/python/test_engines_docs.py runs it",
}


def python_docs():
    for path in DOCS:
        blocks = BLOCK.findall(path.read_text())
        if blocks:
            yield path.relative_to(ROOT).as_posix(), blocks


@pytest.mark.parametrize("doc, blocks", list(python_docs()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_doc_examples_run(doc, blocks, build_dir, tmp_path):
    if doc in SKIP:
        pytest.skip(SKIP[doc])
    extra = (SETUP[doc](tmp_path) if doc in SETUP else None) or {}
    script = tmp_path / "example.py"
    script.write_text("\n".join(blocks))
    env = dict(os.environ, PYTHONPATH=str(build_dir / "python"), **extra)
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        if "PINSTAGE_CACHE_DIR" in extra:
            import shutil
            shutil.rmtree(extra["PINSTAGE_CACHE_DIR"], ignore_errors=True)
    assert proc.returncode == 0, f"{doc}:\n{proc.stderr}"
    assert proc.stderr == "", f"{doc} wrote to stderr:\n{proc.stderr}"


def test_every_doc_with_python_is_covered():
    """The test sees the docs it should (a regex that matched nothing would pass)."""
    names = {doc for doc, _ in python_docs()}
    assert {"README.md", "docs/python.md", "docs/howto-stage-torch.md"} <= names
