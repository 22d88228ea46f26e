"""Issue 42, the Ascend engineer: docs/acl.md's "Using pinstage inside your own ACL runtime"
example runs over the libascendcl double (your context and stream, aclrtMemcpyAsync from a
pinned tensor, pinstage finalized last) with no violation; and "torch_npu": the typed device
views refuse on acl, naming the section, before anything is copied."""
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import BUILD, ROOT
from test_py_acl import LIB, acl_worker, double, violations  # noqa: F401  (the fixtures)

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def acl_doc_blocks():
    return BLOCK.findall((ROOT / "docs" / "acl.md").read_text())


def test_the_own_runtime_example_runs_on_the_double(double, tmp_path):
    blocks = acl_doc_blocks()
    assert blocks, "docs/acl.md has no python example"
    script = tmp_path / "own_runtime.py"
    script.write_text("\n".join(blocks))
    env = dict(os.environ, PYTHONPATH=str(BUILD / "python"), PINSTAGE_ACL_LIBRARY=str(LIB))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "VIOLATION" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_typed_device_views_refuse_on_acl_naming_torch_npu(acl_worker):
    import pinstage

    buf = acl_worker.alloc_device(64)
    with pytest.raises(pinstage.Error, match=r'kDLExtDev.*docs/acl.md, "torch_npu"') as e:
        buf.as_tensor(torch.float32, (16,))
    assert e.value.code == "unsupported"
    with pytest.raises(pinstage.Error, match=r'docs/acl.md, "torch_npu"') as e:
        acl_worker.to_device(torch.ones(4))
    assert e.value.code == "unsupported"
    assert acl_worker.stats().device_count == 1  # to_device took nothing: only buf
    buf.close()


def test_a_pinned_tensor_round_trips_through_the_worker_on_acl(acl_worker):
    import pinstage

    host = pinstage.PinnedTorchAllocator(acl_worker).copy(torch.arange(8.0))
    dev = acl_worker.alloc_device(32)
    acl_worker.copy_to_device_async(dev, host).wait()
    back = pinstage.PinnedTorchAllocator(acl_worker).zeros(8)
    acl_worker.copy_to_host_async(back, dev).wait()
    assert torch.equal(back, host)
    del host, back, dev


def test_scene_on_acl_computes_no_golden_it_cannot_compare(cli, double):
    """`scene --backend acl` computed the golden, then printed "golden skipped"."""
    import json

    env = dict(os.environ, PINSTAGE_ACL_LIBRARY=str(LIB))
    proc = subprocess.run([str(cli), "scene", "qwen3-decode", "--backend", "acl", "--layers", "1",
                           "--seq-len", "64", "--rounds", "1", "--json", "-"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["integrity_only"] and report["ok"]
    assert report["golden_seconds"] == 0, "a golden was computed that nothing compares"
    assert "golden skipped" not in proc.stderr and "no golden compared" in proc.stderr
    assert "VIOLATION" not in proc.stderr
