"""pytest plugin for code that uses pinstage: ``pytest -p pinstage.testing`` (or
``pytest_plugins = ["pinstage.testing"]`` in a conftest.py). See docs/python.md.

Fixtures:
  pinstage_worker  an initialized Worker on the backend given by ``--pinstage-backend``,
                   else the PINSTAGE_TEST_BACKEND environment variable, else "sim";
                   finalized after the test.
  pinned_alloc     a PinnedTorchAllocator on pinstage_worker.

After a failed test the traceback still holds the test's tensors, so finalize() would
refuse: the fixture then leaves the worker to finalize when its last reference goes,
and only the test's own failure is reported. After a passing test, views still alive
are a leak and a teardown error names them.
"""
import gc
import os

import pytest

import pinstage

_REPORT = "_pinstage_call_report"


def pytest_addoption(parser):
    group = parser.getgroup("pinstage")
    group.addoption("--pinstage-backend", default=None, metavar="NAME",
                    help="backend of the pinstage_worker fixture (default: "
                         "$PINSTAGE_TEST_BACKEND, else sim)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        setattr(item, _REPORT, report)


def backend_of(config):
    """The backend the fixtures use: option, then environment, then "sim"."""
    return (config.getoption("--pinstage-backend")
            or os.environ.get("PINSTAGE_TEST_BACKEND") or "sim")


@pytest.fixture
def pinstage_worker(request):
    """An initialized pinstage.Worker, finalized after the test."""
    worker = pinstage.Worker(backend=backend_of(request.config))
    yield worker
    report = getattr(request.node, _REPORT, None)
    gc.collect()
    if report is not None and report.failed and worker.live_views > 0:
        return  # the failure's traceback holds views: it alone is reported
    worker.finalize()  # BufferError naming what a passing test leaked


@pytest.fixture
def pinned_alloc(pinstage_worker):
    """A pinstage.PinnedTorchAllocator on pinstage_worker."""
    return pinstage.PinnedTorchAllocator(pinstage_worker)
