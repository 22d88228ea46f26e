"""Shared pytest fixtures: where the CMake build put the CLI and the Python module.

PINSTAGE_BUILD_DIR names the build folder (default: <repo>/build)."""
import gc
import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The pages the docs tests read (test_docs_cpp.py, test_docs_shell.py): the README and docs/.
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("**/*.md"))


def fenced_blocks(lang):
    """The ```LANG blocks of a page: `body`, and `mark` from a `<!-- docs-test: MARK -->`
    line just before the fence, when there is one."""
    return re.compile(r"^(?:<!-- docs-test: (?P<mark>[^>]*?) -->\n)?```" + lang +
                      r"\n(?P<body>.*?)^```", re.S | re.M)

BUILD = pathlib.Path(os.environ.get("PINSTAGE_BUILD_DIR", ROOT / "build")).resolve()

# The extension module is built into <build>/python/pinstage.
sys.path.insert(0, str(BUILD / "python"))


@pytest.fixture(scope="session")
def build_dir():
    return BUILD


@pytest.fixture(scope="session")
def cli():
    path = BUILD / "bin" / "pinstage"
    if not path.exists():
        pytest.fail(f"{path} not found: build the project first (see README)")
    return path


@pytest.fixture
def worker():
    """A sim worker, finalized after the test once its views are collected."""
    import pinstage  # after sys.path holds the build's module

    w = pinstage.Worker()
    yield w
    gc.collect()
    if w.initialized:
        w.finalize()


@pytest.fixture
def alloc(worker):
    """A PinnedTorchAllocator on the `worker` fixture."""
    import pinstage

    return pinstage.PinnedTorchAllocator(worker)
