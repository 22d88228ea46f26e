"""scripts/check-includes.py: the tree is clean, and each kind of planted leak fails it."""
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)

SCRIPT = ROOT / "scripts" / "check-includes.py"
FOLDERS = ("src", "include", "scenes", "python/src", "apps", "tools")


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True,
                          text=True, check=False)


@pytest.fixture()
def tree(tmp_path):
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("*.so", "*.o", "__pycache__"))
    return tmp_path


def plant(path, line):
    text = path.read_text()
    path.write_text(line + "\n" + text)


def test_the_tree_is_clean():
    result = run(ROOT)
    assert result.returncode == 0, result.stderr
    assert "include check: clean" in result.stdout


@pytest.mark.parametrize("file, line, why", [
    # base reaching up to the runtime
    ("src/base/log.cpp", '#include "pinstage/worker.h"', "base may not include runtime"),
    # tensor's public header naming the Worker's header (a forward declaration serves)
    ("include/pinstage/tensor.h", '#include "pinstage/worker.h"',
     "tensor may not include runtime"),
    # a plugin reaching into the runtime's private headers
    ("src/backends/sim/dma.cpp", '#include "runtime/worker_state.h"',
     "backend may not include runtime's private headers"),
    # one backend using another's private header
    ("src/backends/cuda/cuda_backend.cpp", '#include "backends/sim/dma.h"',
     "backend may not include backend sim's headers"),
    # the library depending on a scene
    ("src/bench/runner.cpp", '#include "pinstage/qwen3/scene.h"',
     "bench may not include scene qwen3's headers"),
    # the CLI using a private header of the library
    ("apps/pinstage/cmd_demo.cpp", '#include "runtime/plugin.h"',
     "app may not include runtime's private headers"),
    # the Python module below a scene, the reverse of the diagram
    ("python/src/worker.cpp", '#include "pinstage/qwen3/scene.h"',
     "python may not include scene qwen3's headers"),
    # a lower library layer reaching up into a higher one's private header
    ("src/runtime/worker.cpp", '#include "tensor/strict_json.h"',
     "runtime may not include tensor's private headers"),
])
def test_a_planted_leak_fails(tree, file, line, why):
    plant(tree / file, line)
    result = run(tree)
    assert result.returncode == 1
    assert f"{file}:1: includes {line.split()[1].strip(chr(34))}: {why}" in result.stderr


def test_a_public_header_without_a_layer_fails(tree):
    (tree / "include/pinstage/new_thing.h").write_text("#pragma once\n")
    result = run(tree)
    assert result.returncode == 1
    assert "include/pinstage/new_thing.h: a public header with no layer" in result.stderr


def test_a_source_of_tensor_may_take_the_worker_but_its_header_may_not(tree):
    # allocator.cpp includes worker.h (allowed: it pins through the public API)
    assert '#include "pinstage/worker.h"' in (tree / "src/tensor/allocator.cpp").read_text()
    assert run(tree).returncode == 0
    plant(tree / "include/pinstage/dtype.h", '#include "pinstage/worker.h"')
    assert "include/pinstage/dtype.h:1: includes pinstage/worker.h" in run(tree).stderr
