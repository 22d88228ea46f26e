"""The acl backend from Python, over the libascendcl test double the CMake build puts at
<build>/fake_acl/lib64/libascendcl.so, chosen with PINSTAGE_ACL_LIBRARY. The double
records every rule the backend breaks; each test checks there was none."""
import ctypes
import gc
import os
import subprocess
import sys

import pytest
import torch

from conftest import BUILD

LIB = BUILD / "fake_acl" / "lib64" / "libascendcl.so"


@pytest.fixture(scope="module")
def double():
    if not LIB.exists():
        pytest.fail(f"{LIB} not found: build the project first (the acl test double)")
    os.environ["PINSTAGE_ACL_LIBRARY"] = str(LIB)  # read when the plugin loads the runtime
    lib = ctypes.CDLL(str(LIB))  # the same object the plugin loads
    lib.pinstage_fake_acl_violations.restype = ctypes.c_uint64
    lib.pinstage_fake_acl_violation_text.restype = ctypes.c_char_p
    lib.pinstage_fake_acl_violation_text.argtypes = [ctypes.c_uint64]
    return lib


def violations(lib):
    texts, i = [], 0
    while (t := lib.pinstage_fake_acl_violation_text(i)) is not None:
        texts.append(t.decode())
        i += 1
    return texts


@pytest.fixture
def acl_worker(double):
    import pinstage

    double.pinstage_fake_acl_reset()
    w = pinstage.Worker(backend="acl")
    yield w
    gc.collect()
    w.finalize()
    assert violations(double) == []


def test_worker_allocates_pinned_memory_on_acl(acl_worker):
    assert acl_worker.backend == "acl" and acl_worker.backend_path.endswith("backend_acl.so")
    caps = acl_worker.capabilities
    assert caps.pinned_is_page_locked and caps.async_copy and not caps.execute
    buf = acl_worker.alloc_pinned_host(10_000)
    t = torch.from_dlpack(buf)
    t.fill_(7)
    assert t.numel() == 10_000 and int(t.sum()) == 70_000
    assert acl_worker.stats().pinned_bytes == 10_000
    del t, buf
    gc.collect()
    assert acl_worker.stats().pinned_count == 0


def test_torch_allocator_and_a_bind_move_the_bytes(acl_worker):
    import pinstage
    from pinstage import Binder, PinnedTorchAllocator, TaskArgs

    alloc = PinnedTorchAllocator(acl_worker)
    x = alloc.normal((512, 64))
    assert alloc.is_pinned(x)
    inout = alloc.full((256,), 3.0)
    pageable = torch.arange(333, dtype=torch.float32)
    args = TaskArgs()
    args.add("x", x)
    args.add("pageable", pageable)
    args.add("inout", inout, "inout")
    # No execute step on acl: upload, verify (read back and compare), download.
    binder = Binder(acl_worker, upload="staged", staging_buffer_bytes=4096, verify_upload=True)
    report = binder.run(args)
    assert not report.executed
    assert report.uploaded_count == 3 and report.uploaded_bytes == (512 * 64 + 333 + 256) * 4
    assert torch.equal(inout, torch.full((256,), 3.0))  # came back unchanged
    assert acl_worker.stats().device_count == 0
    with pytest.raises(pinstage.Error) as e:  # said clearly, never skipped silently
        Binder(acl_worker, execute="sim.fill_index").run(args)
    assert e.value.code == "unsupported"
    del x, inout, args
    gc.collect()


def test_no_runtime_is_one_clear_line(tmp_path):
    env = dict(os.environ, PINSTAGE_ACL_LIBRARY=str(tmp_path / "libascendcl.so"),
               PYTHONPATH=str(BUILD / "python"))
    code = "import pinstage\npinstage.Worker(backend='acl')\n"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "no Ascend runtime (libascendcl.so) could be loaded; tried: PINSTAGE_ACL_LIBRARY " \
           f"{tmp_path}/libascendcl.so (no such file)" in last, r.stderr
