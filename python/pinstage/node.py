"""The node level: one process driving every device of a host (docs/node.md).

    group = pinstage.WorkerGroup("sim", "all", config={"devices": "2"})
    report = group.bind([args0, args1])          # every device at once
    tp = pinstage.load_to_devices("model/", group, plan)
    tp.ranks[1]["model.layers.0.q_proj.weight"]  # a DeviceBuffer on device 1

A WorkerGroup is one pinstage.Worker per device, each with its pinned memory on its
device's NUMA node and a thread team of its own (the C++ WorkerGroup does the work).
"""
from . import _pinstage
from ._pinstage import Worker, parse_device_list, split_threads
from .checkpoint import _int, _open_checkpoint, _options, _progress, _running
from .tp import _plan


def _device_ids(devices, infos):
    if isinstance(devices, str):
        return parse_device_list(devices, infos)
    if isinstance(devices, (list, tuple)):
        ids = [_int(d, "WorkerGroup", "a device id", 31) for d in devices]
        return parse_device_list(",".join(str(i) for i in ids), infos)
    raise TypeError("WorkerGroup(): devices must be 'all', '0,1' or a list of ids, not "
                    f"{type(devices).__name__}")


class WorkerGroup:
    """WorkerGroup(backend="sim", devices="all", *, threads=0, **options): a Worker per
    device (ids as parse_device_list reads them, or a list), in that order. options are
    Worker's; host_numa_node unset places each worker's pinned memory on its device's
    node. threads (0 = the process's) are split over the devices' teams."""

    def __init__(self, backend="sim", devices="all", *, threads=0, **options):
        infos = _pinstage.devices(backend, **options)
        ids = _device_ids(devices, infos)
        threads = _int(threads, "WorkerGroup", "threads", 31)
        workers = []
        try:
            for i in ids:
                own = dict(options)
                if "host_numa_node" not in own and infos[i].numa_node >= 0:
                    own["host_numa_node"] = infos[i].numa_node
                try:
                    workers.append(Worker(backend=backend, device_id=i, **own))
                except Exception as e:
                    e.add_note(f"WorkerGroup: starting device {i}")
                    raise
            self._group = _pinstage._WorkerGroup(workers, threads)
        except BaseException:
            for w in workers:
                w.finalize()
            raise
        self._workers = tuple(workers)

    @property
    def workers(self):
        """tuple[Worker, ...]: each member's Worker, in group order."""
        return self._workers

    def __len__(self):
        return len(self.workers)

    def __getitem__(self, index):
        return self.workers[index]

    def __iter__(self):
        return iter(self.workers)

    @property
    def device_ids(self):
        """list[int]: each member's device id, in group order."""
        return self._group.device_ids

    @property
    def team_threads(self):
        """list[int]: each member's thread team size."""
        return self._group.team_threads

    def bind(self, args, **options):
        """Binds args[i] on member i, all devices at once (GIL released); returns a
        GroupBindReport. options as Binder's. A failing device leaves every device clean
        and raises the cause's error class, its message starting 'device <id>: '."""
        args = list(args)
        if len(args) != len(self.workers):
            raise _pinstage.InvalidArgumentError(
                f"WorkerGroup.bind: {len(args)} TaskArgs for {len(self.workers)} devices "
                "(one per device)")
        return self._group.bind(args, **options)

    def finalize(self, wait=False, timeout=None):
        """Finalizes every member (Worker.finalize's rules: BufferError while views live)."""
        for w in self.workers:
            w.finalize(wait=wait, timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    def __repr__(self):
        return (f"<pinstage.WorkerGroup devices={self.device_ids} "
                f"threads={self.team_threads}>")


class TpDeviceLoad:
    """What load_to_devices loaded: `ranks[r]` is {name: DeviceBuffer} on member r's
    device (None for a tensor of 0 bytes), `slices[r]` {name: (dtype, shape)} of those
    slices, `report` the figures (read_bytes, checkpoint_bytes, uploaded_bytes,
    upload_gbps, per device under "uploads"). close() frees every device buffer."""

    __slots__ = ("ranks", "slices", "report")

    def __init__(self, ranks, slices, report):
        self.ranks = ranks
        self.slices = slices
        self.report = report

    def close(self):
        for rank in self.ranks:
            for buffer in rank.values():
                if buffer is not None:
                    buffer.close()

    def __repr__(self):
        return (f"<pinstage.TpDeviceLoad devices={self.report['devices']}: "
                f"{self.report['uploaded_bytes']} bytes uploaded>")


def load_to_devices(path, group, plan=None, *, verify=False, threads=0, chunk_bytes=8 << 20,
                    direct=False, progress=None):
    """Loads the checkpoint at `path` onto every device of `group` (a WorkerGroup) by the
    tensor-parallel `plan` (as load_tp's): rank r is member r, the files are read once for
    the node, each device receives only its slices. Returns a TpDeviceLoad. A split that
    cannot be made is InvalidArgumentError before any memory is taken; a failed load frees
    every device's memory and names the device."""
    if not isinstance(group, WorkerGroup):
        raise TypeError(f"load_to_devices needs a pinstage.WorkerGroup, got "
                        f"{type(group).__name__}")
    options = _options("load_to_devices", threads, chunk_bytes, verify, direct)
    progress = _progress(progress, "load_to_devices")
    plan = _plan(plan, "load_to_devices")
    checkpoint = _open_checkpoint(path, "load_to_devices", options["verify"])
    with _running(progress):
        ranks, report = group._group.load_tp(checkpoint, plan, progress=progress, **options)
    buffers = [{name: buf for name, _dtype, _shape, buf in rank} for rank in ranks]
    slices = [{name: (dtype, shape) for name, dtype, shape, _buf in rank} for rank in ranks]
    return TpDeviceLoad(buffers, slices, report)
