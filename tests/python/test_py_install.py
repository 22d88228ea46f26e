"""`pip install --no-build-isolation .` into a fresh venv, then a script outside the source
tree imports pinstage, allocates, binds and finalizes (issue 12). It builds the whole
project in its own CMake tree, so it takes minutes: marked slow and run only with
PINSTAGE_SLOW_TESTS=1 (PINSTAGE_INSTALL_CMAKE_DIR keeps that tree between runs)."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import pathlib, sys, torch, pinstage
    here = pathlib.Path(pinstage.__file__).parent
    assert "site-packages" in str(here), here
    w = pinstage.Worker()
    assert pathlib.Path(w.backend_path).parent == here, w.backend_path
    alloc = pinstage.PinnedTorchAllocator(w)
    x = alloc.randn(64, 64, seed=3)
    y = alloc.zeros(64, 64)
    args = pinstage.TaskArgs()
    args.add("x", x)
    args.add("y", y, "out")
    report = pinstage.Binder(w).run(args)
    assert report.uploaded_bytes == x.numel() * 4 and report.tensors[0].pinned
    del x, y, args
    w.finalize()
    print("ok", pinstage.__version__)
""")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PINSTAGE_SLOW_TESTS") != "1",
                    reason="slow (a full build): set PINSTAGE_SLOW_TESTS=1")
def test_pip_install_into_a_venv_and_use_it_elsewhere(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PINSTAGE_CMAKE_BUILD_DIR"] = os.environ.get("PINSTAGE_INSTALL_CMAKE_DIR",
                                                     str(tmp_path / "cmake"))
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation",
                           "--no-index", str(ROOT)], env=env, capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "use.py").write_text(SCRIPT)
    proc = subprocess.run([str(python), "use.py"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import pinstage  # the build tree's module (conftest.py): the one version, from CMake

    assert proc.stdout.split() == ["ok", pinstage.__version__]
    # The pytest plugin of an installed pinstage needs no PYTHONPATH (docs/python.md).
    (elsewhere / "test_user.py").write_text(
        "def test_it(pinstage_worker, pinned_alloc):\n    assert pinned_alloc.ones(2).sum() == 2\n")
    proc = subprocess.run([str(python), "-m", "pytest", "-p", "pinstage.testing", "-q",
                           "-p", "no:cacheprovider", "test_user.py"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
