"""pinstage: stage a model's arguments through a device worker's pinned host memory.

The API reference is docs/python.md. Quick start:

    import torch, pinstage
    worker = pinstage.Worker(backend="sim")
    alloc = pinstage.PinnedTorchAllocator(worker)
    x = alloc.zeros((16, 5120), torch.bfloat16)   # a torch tensor in pinned memory
"""
import sys as _sys

from . import _pinstage
from ._pinstage import __version__ as _pinstage_version
from ._pinstage import (  # noqa: F401
    BackendDescription,
    Binder,
    ResidentBinder,
    BindError,
    BindReport,
    Capabilities,
    Comparison,
    CopyEvent,
    DeviceBuffer,
    DeviceInfo,
    Error,
    GroupBindReport,
    InvalidArgumentError,
    PinnedHostBuffer,
    ReadOnlyError,
    SceneGolden,
    SceneReport,
    SceneRound,
    TaskArgs,
    TensorBindReport,
    TensorComparison,
    TpPlan,
    Worker,
    WorkerStats,
    backends,
    devices,
    error_code_names,
    parse_device_list,
    qwen3,
    require_chip_worker,
    run_scene,
    scene_advance,
    scene_callable,
    scene_compare,
    scene_compute_golden,
    scene_describe,
    scene_make_args,
    scene_names,
    scene_params,
    split_threads,
    tp_part,
    xxh3_64,
)

# `import pinstage.qwen3` works like any submodule.
_sys.modules[__name__ + ".qwen3"] = qwen3

from . import scene  # noqa: E402,F401
from .staging import PendingTensor  # noqa: E402,F401  (also adds Worker.to_device/to_host)

DeviceLoad = _pinstage._DeviceLoad  # what load_to_device returns (tensor(name): a typed view)


def _as_mapping(cls):
    """cls (with __getitem__, __iter__, __len__, __contains__, keys) as a read-only
    collections.abc.Mapping: its items/values/get, and isinstance(x, Mapping), which
    torch's load_state_dict checks."""
    import collections.abc
    for name in ("items", "values", "get"):
        setattr(cls, name, getattr(collections.abc.Mapping, name))
    collections.abc.Mapping.register(cls)


_as_mapping(DeviceLoad)

__version__ = _pinstage_version  # project(VERSION) in CMakeLists.txt, via libpinstage

# torch is imported only when a torch-facing name is first used, so `import pinstage`
# stays cheap and works without torch.
_LAZY = {name: module for module, names in (
    ("torch_alloc", ("PinnedTorchAllocator", "is_pinned")),
    ("checkpoint", ("safe_open", "SafeSlice", "load_file", "iter_tensors", "load_to_device")),
    ("_readonly", ("ReadOnlyTensor",)),
    ("tp", ("load_tp", "TpLoad")),
    ("node", ("WorkerGroup", "load_to_devices", "TpDeviceLoad")),
) for name in names}  # name -> the submodule defining it under that name


def __getattr__(name):
    if name in ("distributed", "cache"):  # pinstage.distributed imports torch.distributed
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pinstage' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + list(_LAZY) + ["distributed", "cache"])


__all__ = [
    "Binder", "BindError", "BindReport", "Capabilities", "Error", "InvalidArgumentError",
    "PinnedHostBuffer", "PinnedTorchAllocator", "TaskArgs", "is_pinned", "TensorBindReport", "Worker",
    "WorkerStats", "error_code_names", "qwen3", "require_chip_worker", "scene",
    "Comparison", "TensorComparison", "SceneRound", "SceneReport", "SceneGolden", "scene_names",
    "scene_params", "scene_describe", "scene_callable", "scene_make_args",
    "scene_compute_golden", "scene_compare", "run_scene", "ResidentBinder", "scene_advance",
    "safe_open", "load_file", "load_to_device", "DeviceBuffer", "CopyEvent", "xxh3_64",
    "SafeSlice", "TpPlan", "tp_part", "load_tp", "TpLoad", "DeviceInfo", "devices",
    "WorkerGroup", "GroupBindReport", "load_to_devices", "TpDeviceLoad", "parse_device_list",
    "split_threads", "PendingTensor", "DeviceLoad", "ReadOnlyTensor", "ReadOnlyError",
    "iter_tensors", "BackendDescription", "backends",
]
