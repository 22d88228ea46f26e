"""Issue 42, the installer's path: `pip install --no-build-isolation .` in a plain venv
(no `wheel`) stops with what to do, not setuptools' "invalid command 'bdist_wheel'"; the
`pinstage` console command runs the CLI binary (python/pinstage/_cli.py)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_pip_without_wheel_says_what_to_do(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    has_wheel = subprocess.run([str(python), "-c", "import wheel"], capture_output=True)
    if has_wheel.returncode == 0:
        pytest.skip("this Python's plain venv brings wheel")
    has_own = subprocess.run([str(python), "-c", "import setuptools.command.bdist_wheel"],
                             capture_output=True)
    if has_own.returncode == 0:
        pytest.skip("this venv's setuptools has its own bdist_wheel (>= 70.1)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation",
                           "--no-index", str(ROOT)], env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "invalid command 'bdist_wheel'" not in out, out[-3000:]
    assert "run `python -m pip install wheel` first" in out, out[-3000:]


def test_the_documented_pip_path_names_wheel():
    text = (ROOT / "docs" / "python.md").read_text()
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "pip install wheel" in install and "--no-build-isolation" in install


def test_pyproject_declares_the_pinstage_command():
    """[project.scripts], where setuptools >= 84 reads it (issue 49: setup.py's entry points
    are dropped once pyproject.toml has a [project] table); the wheel's own entry points are
    checked by test_pip49.py."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"pinstage": "pinstage._cli:main"}
    assert "entry_points" not in (ROOT / "setup.py").read_text(), "ignored there: pyproject only"


def test_the_console_command_runs_the_cli(build_dir):
    import pinstage
    from pinstage import _cli

    assert _cli.cli_path() is not None, "no CLI beside the package nor in <build>/bin"
    proc = subprocess.run([sys.executable, "-m", "pinstage._cli", "--version"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(pathlib.Path(
                              pinstage.__file__).parent.parent)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pinstage {pinstage.__version__}"
