"""The how-to's code runs as written (docs/howto-stage-torch.md)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_howto_stage_torch_runs(build_dir, tmp_path):
    text = (ROOT / "docs" / "howto-stage-torch.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    assert "PinnedTorchAllocator" in code and "Binder" in code
    script = tmp_path / "howto.py"
    script.write_text(code)
    env = {"PYTHONPATH": str(build_dir / "python"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tensors uploaded (inputs)" in proc.stdout
    assert proc.stderr == "", proc.stderr  # no warnings, e.g. nothing left at finalize
