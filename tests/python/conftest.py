"""Shared pytest fixtures: where the CMake build put the CLI and the Python module.

PINSTAGE_BUILD_DIR names the build folder (default: <repo>/build)."""
import gc
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
