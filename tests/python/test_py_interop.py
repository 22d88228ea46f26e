"""Interop with the consumers users actually run (issue 16): views that torch.frombuffer /
torch.asarray keep, DLPack 1.0 versioned capsules, copy=True, dl_device, the buffer type's
slots and finality. Versioned capsules are read with ctypes from the DLPack 1.0 layout,
since Debian's torch 1.13 and NumPy 1.24 only consume the unversioned one."""
import ctypes
import enum
import gc

import numpy as np
import pytest
import torch

import pinstage


# ---- torch.frombuffer / torch.asarray: the Py_buffer is released at once ----

def test_frombuffer_view_keeps_the_buffer_alive(worker):
    b = worker.alloc_pinned_host(4096)
    t = torch.frombuffer(b, dtype=torch.uint8)  # torch keeps Py_buffer.obj only
    assert b.live_views == 1
    with pytest.raises(BufferError, match=r"1 live view\(s\)"):
        b.close()
    with pytest.raises(BufferError, match=r"still have 1 live view\(s\)"):
        worker.finalize()
    t[7] = 42  # the memory is still allocated: this write would be a use after free
    assert memoryview(b)[7] == 42 and not b.closed
    del t
    gc.collect()
    assert b.live_views == 0
    b.close()
    assert b.closed and worker.stats().pinned_count == 0


def test_asarray_view_is_counted(worker):
    b = worker.alloc_pinned_host(256)
    t = torch.asarray(b, dtype=torch.uint8)
    t[0] = 9
    assert memoryview(b)[0] == 9  # zero-copy
    assert b.live_views == 1
    with pytest.raises(BufferError):
        b.close()
    del t
    gc.collect()
    b.close()


def test_numpy_frombuffer_counts_through_its_base(worker):
    b = worker.alloc_pinned_host(64)
    a = np.frombuffer(b, dtype=np.uint8)
    assert b.live_views == 1
    with pytest.raises(BufferError):
        b.close()
    del a
    assert b.live_views == 0


def test_memoryview_obj_is_a_counted_export(worker):
    b = worker.alloc_pinned_host(64)
    mv = memoryview(b)
    assert isinstance(mv.obj, pinstage._pinstage.BufferExport) and mv.obj.buffer is b
    assert "BufferExport" in repr(mv.obj)
    mv.release()
    assert b.live_views == 0


def test_task_args_pin_only_what_they_keep_alive(worker):
    """A tensor over pinned memory made without any counted view (here through a raw
    address) is marked pinned only because the args hold a lease on its buffer."""
    b = worker.alloc_pinned_host(4096)
    address = np.frombuffer(b, dtype=np.uint8).ctypes.data
    gc.collect()
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * 4096).from_address(address))
    t = torch.from_numpy(raw).view(torch.float32)
    assert b.live_views == 0  # nothing counts the raw alias
    args = pinstage.TaskArgs()
    args.add("x", t)
    assert args.describe()[0]["pinned"] is True
    assert b.live_views == 1  # ... but the args do
    with pytest.raises(BufferError):
        b.close()
    with pytest.raises(BufferError, match="PinnedHostBuffer at 0x"):
        worker.finalize()
    del args
    gc.collect()
    assert b.live_views == 0
    del t, raw
    b.close()


# ---- DLPack 1.0 ----

class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]


def consume_versioned(capsule):
    """Takes a 'dltensor_versioned' capsule as a consumer does; returns the struct."""
    address = _get_pointer(capsule, b"dltensor_versioned")
    assert _set_name(capsule, b"used_dltensor_versioned") == 0
    return DLManagedTensorVersioned.from_address(address)


def test_max_version_1_0_gives_a_versioned_writable_capsule(worker):
    b = worker.alloc_pinned_host(64)
    memoryview(b)[5] = 77
    capsule = b.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(capsule)
    managed = consume_versioned(capsule)
    assert (managed.major, managed.minor) == (1, 0)
    assert managed.flags == 0  # writable, not a copy
    t = managed.dl_tensor
    assert (t.device_type, t.device_id, t.ndim, t.code, t.bits, t.lanes) == (1, 0, 1, 1, 8, 1)
    assert t.shape[0] == 64 and bool(t.strides) and t.strides[0] == 1  # explicit strides
    assert ctypes.c_uint8.from_address(t.data + 5).value == 77
    del capsule
    assert b.live_views == 1  # consumed: the consumer's deleter ends the view
    DELETER(managed.deleter)(ctypes.pointer(managed))
    assert b.live_views == 0


def test_unconsumed_versioned_capsule_ends_its_view(worker):
    b = worker.alloc_pinned_host(64)
    capsule = b.__dlpack__(max_version=(1, 3))  # a newer minor still gets 1.0
    assert b.live_views == 1
    del capsule
    assert b.live_views == 0


def test_old_consumers_get_the_unversioned_capsule_with_strides(worker):
    b = worker.alloc_pinned_host(64)
    for max_version in (None, (0, 8)):
        capsule = b.__dlpack__(max_version=max_version)
        assert "dltensor" in repr(capsule) and "versioned" not in repr(capsule)
        address = _get_pointer(capsule, b"dltensor")
        t = DLTensor.from_address(address)
        assert bool(t.strides) and t.strides[0] == 1
    with pytest.raises(TypeError, match="max_version must be a"):
        b.__dlpack__(max_version=1)


def test_nd_dlpack_export_is_row_major_for_torch_and_numpy(worker, alloc):
    """The N-d export (TaskArgs' zero-copy views) gives row-major strides: a 3-D pinned
    tensor read back through DLPack by torch, then by NumPy, has C strides and the values
    at every probed index, so a column-major stride bug cannot pass."""
    shape = (3, 4, 5)
    x = alloc.empty(*shape, dtype=torch.float32)
    x.view(-1).copy_(torch.arange(60, dtype=torch.float32))  # x[i, j, k] = 20i + 5j + k
    args = pinstage.TaskArgs()
    args.add("x", x)
    view = args["x"]  # torch.from_dlpack of the C++ export, over x's pinned bytes
    assert view.shape == shape and view.stride() == (20, 5, 1) and view.is_contiguous()
    assert view.data_ptr() == x.data_ptr()
    array = np.from_dlpack(view)
    assert array.shape == shape and array.strides == (80, 20, 4)
    assert array.flags["C_CONTIGUOUS"]
    for i, j, k in [(0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 2, 3), (2, 3, 4), (2, 0, 4)]:
        want = 20 * i + 5 * j + k
        assert view[i, j, k].item() == want, (i, j, k)
        assert array[i, j, k] == want, (i, j, k)
    x[1, 2, 3] = -1.0  # the same memory, not a copy
    assert view[1, 2, 3].item() == -1.0 and array[1, 2, 3] == -1.0
    del view, array, args, x


def test_copy_true_returns_a_flagged_copy(worker):
    b = worker.alloc_pinned_host(16)
    memoryview(b)[3] = 3
    capsule = b.__dlpack__(max_version=(1, 0), copy=True)
    assert b.live_views == 0  # a copy is no view of the buffer
    managed = consume_versioned(capsule)
    assert managed.flags & 2  # IS_COPIED
    t = managed.dl_tensor
    assert t.data != np.frombuffer(b, dtype=np.uint8).ctypes.data
    assert ctypes.c_uint8.from_address(t.data + 3).value == 3
    memoryview(b)[3] = 4
    assert ctypes.c_uint8.from_address(t.data + 3).value == 3  # independent bytes
    DELETER(managed.deleter)(ctypes.pointer(managed))
    # An old consumer gets a copy too, and torch takes it.
    copied = torch.from_dlpack(b.__dlpack__(copy=True))
    copied[3] = 99
    assert memoryview(b)[3] == 4 and b.live_views == 0
    assert b.__dlpack__(copy=False) is not None  # zero-copy, as None
    with pytest.raises(TypeError, match="copy must be True, False or None"):
        b.__dlpack__(copy=1)


class DLDeviceType(enum.IntEnum):
    kDLCPU = 1
    kDLCUDAHost = 3


class PlainDeviceType(enum.Enum):
    kDLCPU = 1


def test_dl_device_takes_enums_and_refuses_other_ids(worker):
    b = worker.alloc_pinned_host(16)
    assert b.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0)) is not None
    assert b.__dlpack__(dl_device=(PlainDeviceType.kDLCPU, 0)) is not None
    assert b.__dlpack__(dl_device=(np.int32(1), np.int64(0))) is not None
    with pytest.raises(BufferError, match=r"device \(1, 5\): host memory has device id 0"):
        b.__dlpack__(dl_device=(1, 5))
    with pytest.raises(BufferError, match="kDLCUDAHost = 3 for the cuda backend"):
        b.__dlpack__(dl_device=(DLDeviceType.kDLCUDAHost, 0))
    with pytest.raises(TypeError, match=r"dl_device must be a \(device_type, device_id\) pair"):
        b.__dlpack__(dl_device="cpu")
    assert b.live_views == 0


# ---- the type ----

def test_buffer_type_is_final():
    with pytest.raises(TypeError):
        class Sub(pinstage.PinnedHostBuffer):  # noqa: F841
            pass


def test_buffer_slots_are_the_types_own(worker):
    """The slots are installed before PyType_Ready (Python 3.12+ derives __buffer__ from
    them); here: memoryview through the type works and counts."""
    b = worker.alloc_pinned_host(8)
    if hasattr(type(b), "__buffer__"):  # Python >= 3.12
        mv = b.__buffer__(0)
        assert b.live_views == 1
        mv.release()
    with memoryview(b) as mv:
        assert mv.nbytes == 8 and b.live_views == 1
    assert b.live_views == 0
