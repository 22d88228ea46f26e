"""DLPack device of a cuda-backed worker's pinned memory: kDLCPU unless the consumer asks
for kDLCUDAHost (PyTorch 1.13's from_dlpack refuses kDLCUDAHost; how torch words that
refusal is torch's business, so it is not asserted). Runs the cuda plugin on
the project's fake CUDA runtime (tests/cpp/test_cuda_fake_runtime.cpp) in a subprocess,
since the runtime must be first on LD_LIBRARY_PATH when the process starts."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, json, torch, pinstage

get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
get_pointer.restype = ctypes.c_void_p
get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

def device_of(capsule):
    # DLManagedTensor starts with DLTensor {void* data; DLDevice device; ...}.
    address = get_pointer(capsule, b"dltensor")
    return tuple((ctypes.c_int32 * 2).from_address(address + ctypes.sizeof(ctypes.c_void_p)))

w = pinstage.Worker(backend="cuda")
b = w.alloc_pinned_host(4096)
out = {"backend": w.backend, "default": list(b.__dlpack_device__())}
out["asked_cuda_host"] = list(device_of(b.__dlpack__(dl_device=(3, 0))))
out["asked_cpu"] = list(device_of(b.__dlpack__(dl_device=(1, 0))))
t = torch.from_dlpack(b)  # the default: kDLCPU, which torch takes
t[:4] = 7
out["views"] = b.live_views
out["read_back"] = memoryview(b)[3]
del t
d = w.alloc_device(256)  # device memory: exported as kDLCUDA on the worker's device
out["device_buffer"] = list(d.__dlpack_device__())
capsule = d.__dlpack__()
out["device_capsule"] = list(device_of(capsule))
address = get_pointer(capsule, b"dltensor")
out["device_data_is_the_buffer"] = ctypes.c_void_p.from_address(address).value == d.device_ptr
try:
    d.close()
except BufferError:
    out["close_refused_with_a_view"] = True
del capsule  # an unconsumed capsule releases its view
d.close()
w.finalize()
print(json.dumps(out))
"""


def test_cuda_backend_exports_cuda_host_only_on_request(build_dir):
    fake = build_dir / "fake_cuda" / "libcudart.so.13"
    plugin = build_dir / "lib" / "libpinstage_backend_cuda.so"
    if not fake.exists() or not plugin.exists():
        pytest.skip("cuda plugin or fake CUDA runtime not built (PINSTAGE_CUDA off)")
    import torch
    if torch.version.cuda:  # its script imports torch first: torch loads its own libcudart
        pytest.skip(f"this torch is built for CUDA {torch.version.cuda}; its runtime would "
                    "load before the fake one")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(fake.parent), env.get("LD_LIBRARY_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(build_dir / "python"), env.get("PYTHONPATH")]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == "cuda"
    assert out["default"] == [1, 0]  # kDLCPU unless asked
    assert out["asked_cuda_host"] == [3, 0]  # kDLCUDAHost on request
    assert out["asked_cpu"] == [1, 0]
    assert out["views"] == 1 and out["read_back"] == 7
    # Device memory (issue 22): kDLCUDA with the worker's device id, the buffer itself.
    assert out["device_buffer"] == [2, 0] and out["device_capsule"] == [2, 0]
    assert out["device_data_is_the_buffer"] and out["close_refused_with_a_view"]
