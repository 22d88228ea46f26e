# Type stubs of pinstage.distributed (docs/distributed.md).
import os
from typing import Any, Literal

import torch

from . import DeviceBuffer, Error, PinnedHostBuffer, Worker, WorkerGroup

READ_MODES: tuple[str, str]
SHM_DIR: str
SHM_PREFIX: str
_Read = Literal["own-slices", "once-per-node"]

class RankFailed(Error):
    phase: str
    failures: dict[int, str]
    def __init__(self, phase: str, failures: dict[int, str]) -> None: ...

class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    cpus: int
    threads: int
    threads_from: str
    backend: str
    devices: list[int]
    device_numa_node: int
    group: WorkerGroup
    worker: Worker
    def close(self) -> None: ...

class ShardedLoad:
    ctx: RankContext
    slices: list[dict[str, Any]]
    buffers: list[PinnedHostBuffer]
    tensors: dict[str, torch.Tensor]
    device: dict[str, DeviceBuffer]
    report: dict[str, Any]
    def close(self) -> None: ...

def local_devices(device_ids: list[int], local_rank: int, local_world_size: int) -> list[int]: ...
def thread_share(cpus: int, local_world_size: int, machine_cpus: int) -> int: ...
def setup(backend: str = "sim", **worker_options: Any) -> RankContext: ...
def sweep_stale_segments(directory: str = ...) -> list[str]: ...
def load_sharded(path: str | os.PathLike[str], plan: dict[str, Any] | str | os.PathLike[str],
                 group: Any = None, read: _Read = "own-slices", *, tp: int | None = None,
                 stage: bool = True, chunk_bytes: int = 8388608,
                 backend: str = "sim",
                 cache: Literal["off", "use", "fill"] = "off") -> ShardedLoad: ...
def fill_cache(path: str | os.PathLike[str], group: Any = None, *,
               dir: str | os.PathLike[str] | None = None) -> dict[str, Any]: ...
def gather_reports(load: ShardedLoad, group: Any = None) -> list[dict[str, Any]]: ...
def slice_digests(load: ShardedLoad) -> dict[str, int]: ...
