"""pytest plugin for code that uses pinstage: ``pytest -p pinstage.testing`` (or
``pytest_plugins = ["pinstage.testing"]`` in a conftest.py). See docs/python.md.

pytest imports the plugin before any test or conftest, so ``pinstage`` must be importable
by then: installed (``pip install .``), or a build tree on PYTHONPATH
(``PYTHONPATH=build/python pytest -p pinstage.testing``); otherwise pytest stops with
"No module named 'pinstage'".

Fixtures:
  pinstage_worker  an initialized Worker on the backend given by ``--pinstage-backend``,
                   else the PINSTAGE_TEST_BACKEND environment variable, else "sim";
                   finalized after the test. A backend with no device here (cuda without
                   a GPU) skips the test.
  pinned_alloc     a PinnedTorchAllocator on pinstage_worker.

A test that raised (failed, xfailed, skipped) leaves its tensors in its traceback's
frames: the fixture clears those frames' locals (the report is already written) and
finalizes the worker. A view the test kept elsewhere (a global) then leaves the worker to
finalize when its last reference goes, and only the test's own outcome is reported. After
a passing test, views still alive are a leak and a teardown error names them.
"""
import gc
import os

import pytest

import pinstage

_REPORT = "_pinstage_call_report"
_EXCINFO = "_pinstage_call_excinfo"


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
        setattr(item, _EXCINFO, call.excinfo)


def backend_of(config):
    """The backend the fixtures use: option, then environment, then "sim"."""
    return (config.getoption("--pinstage-backend")
            or os.environ.get("PINSTAGE_TEST_BACKEND") or "sim")


def _drop_locals(tb):
    """Clears the locals of a finished test's traceback frames, which hold its tensors; the
    report already shows them. Reading f_locals after clear() also empties the snapshot
    dict an earlier read made (CPython < 3.13 keeps it past clear(), and pytest's report
    reads it)."""
    while tb is not None:
        frame = tb.tb_frame
        try:
            frame.clear()
        except RuntimeError:  # a frame still running (none once the call is over)
            pass
        else:
            frame.f_locals  # noqa: B018 - the read resyncs the snapshot
        tb = tb.tb_next


@pytest.fixture
def pinstage_worker(request):
    """An initialized pinstage.Worker, finalized after the test. A backend that is there
    but finds no device here (Error code "no_device": `--pinstage-backend cuda` without a
    GPU) skips the test; one that cannot be loaded at all (a misspelt name) is an error."""
    backend = backend_of(request.config)
    try:
        worker = pinstage.Worker(backend=backend)
    except pinstage.Error as e:
        if e.code != "no_device":
            raise
        pytest.skip(f"pinstage backend {backend!r} has no device here: {e}")
    yield worker
    report = getattr(request.node, _REPORT, None)
    excinfo = getattr(request.node, _EXCINFO, None)
    if hasattr(request.node, _EXCINFO):
        delattr(request.node, _EXCINFO)
    if excinfo is not None:
        _drop_locals(excinfo.tb)  # pytest keeps the traceback (sys.last_traceback)
    del excinfo
    gc.collect()
    ended_badly = report is not None and not report.passed
    if ended_badly and worker.live_views > 0:
        return  # a view kept past the test: its outcome alone is reported
    worker.finalize()  # BufferError naming what a passing test leaked


@pytest.fixture
def pinned_alloc(pinstage_worker):
    """A pinstage.PinnedTorchAllocator on pinstage_worker."""
    return pinstage.PinnedTorchAllocator(pinstage_worker)
