"""pinstage.distributed: pinstage inside torch.distributed ranks (docs/distributed.md).

pinstage is no cluster engine: torchrun starts the processes and torch.distributed (Gloo,
NCCL, HCCL) connects them. Each rank sets itself up from the variables torchrun sets and
loads its tensor-parallel share of a checkpoint:

    torch.distributed.init_process_group("gloo")
    ctx = pinstage.distributed.setup(backend="sim")   # its device, worker, thread share
    load = pinstage.distributed.load_sharded("model/", "plan.json", read="own-slices")
    load.tensors["model.layers.0.q_proj.weight"]     # this rank's slice, pinned
    reports = pinstage.distributed.gather_reports(load)  # every rank's report

Every phase of a load ends with an all_gather of each rank's status, so a rank that fails
makes every rank raise RankFailed naming it, and each rank frees what it took (pinned
buffers, device buffers, shared-memory segments) before raising.
"""
import itertools
import json
import mmap
import os
import re
import time

import torch.distributed as dist

from . import _pinstage
from . import cache as _cache
from ._pinstage import InvalidArgumentError, Worker
from .checkpoint import _open_checkpoint, _torch_dtype, _view

READ_MODES = ("own-slices", "once-per-node")
SHM_DIR = "/dev/shm"
SHM_PREFIX = "pinstage-dist-"
_PLAN_MAX_BYTES = 16 << 20  # kTpPlanMaxBytes
_ALIGN = 4096  # tensors in a segment start on pages, so the readers' copies start aligned

# Test seam: the phase name (e.g. "read", "copy 0") in which this process raises, so a
# test can make one rank fail. Never set outside tests.
_fault_phase = None
_context = None  # the process's RankContext, once setup() made it


class RankFailed(_pinstage.Error):
    """One or more ranks failed a phase of a distributed load: raised on every rank.
    .phase is the phase, .failures {rank: message} the ranks that failed and why."""

    def __init__(self, phase, failures):
        self.phase = phase
        self.failures = dict(failures)
        named = "; ".join(f"rank {r}: {m}" for r, m in sorted(self.failures.items()))
        super().__init__(f"load_sharded: {len(self.failures)} rank(s) failed in phase "
                         f"'{phase}' ({named}); every rank freed its memory")


def _env_int(name, low, high=None):
    text = os.environ.get(name)
    if text is None:
        raise InvalidArgumentError(f"pinstage.distributed: {name} is not set; start the "
                                   "processes with torchrun (or set RANK, LOCAL_RANK, "
                                   "WORLD_SIZE and LOCAL_WORLD_SIZE)")
    if not (text.isascii() and text.isdigit()):
        raise InvalidArgumentError(f"pinstage.distributed: {name}={text!r} is not a whole "
                                   "number")
    value = int(text)
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidArgumentError(f"pinstage.distributed: {name}={value} must be in {bound}")
    return value


def local_devices(device_ids, local_rank, local_world_size):
    """The devices of `device_ids` that local rank `local_rank` of `local_world_size` drives:
    a contiguous block of them when there are at least as many devices as local ranks
    (8 devices, 2 ranks: 4 each), else one device shared round-robin (1 device, 4 ranks:
    all on device 0)."""
    n = len(device_ids)
    if n >= local_world_size:
        return list(device_ids[local_rank * n // local_world_size:
                               (local_rank + 1) * n // local_world_size])
    return [device_ids[local_rank % n]]


def thread_share(cpus, local_world_size, machine_cpus):
    """Threads for one of `local_world_size` ranks of a node: its share of the `cpus` in
    its affinity mask, at least 1. A mask narrower than the machine (`machine_cpus`) was
    narrowed for this rank by its launcher (taskset, numactl, a cpuset): it is all its own."""
    if cpus < machine_cpus:
        return cpus
    return max(1, cpus // local_world_size)


def _usable_devices(backend, worker_options):
    """The backend's usable devices (pinstage.devices(): id, NUMA node, ...)."""
    found = _pinstage.devices(backend, **worker_options)
    usable = [d for d in found if d.usable]
    if not usable:
        raise InvalidArgumentError(
            f"pinstage.distributed.setup(): backend {backend!r} has no usable device "
            f"({len(found)} listed)")
    return usable


class RankContext:
    """This process's place in the job and what it built: rank, local_rank, world_size,
    local_world_size, node (the global rank of its node's local rank 0), devices (the
    device ids it drives), device_numa_node (devices[0]'s NUMA node, -1 unknown), group
    (a pinstage.WorkerGroup over those devices, each worker's pinned memory on its device's
    node, the rank's threads split over them), worker (group[0], on devices[0];
    worker.host_numa_node is the node in force), threads (its thread share) and threads_from
    ('PINSTAGE_NUM_THREADS' when set by the user, else 'share')."""

    def __init__(self, backend, worker_options):
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if self.rank >= self.world_size or self.local_rank >= self.local_world_size:
            raise InvalidArgumentError(
                f"pinstage.distributed: RANK={self.rank} / WORLD_SIZE={self.world_size}, "
                f"LOCAL_RANK={self.local_rank} / LOCAL_WORLD_SIZE={self.local_world_size}: "
                "a rank must be below its size")
        if dist.get_rank() != self.rank or dist.get_world_size() != self.world_size:
            raise InvalidArgumentError(
                f"pinstage.distributed: RANK={self.rank} WORLD_SIZE={self.world_size}, but "
                f"the process group says rank {dist.get_rank()} of {dist.get_world_size()}")
        self.node = self.rank - self.local_rank
        self.cpus = _pinstage.usable_cpu_count()
        user = os.environ.get("PINSTAGE_NUM_THREADS")
        if user is None:
            self.threads_from = "share"
            share = thread_share(self.cpus, self.local_world_size, os.cpu_count() or self.cpus)
            os.environ["PINSTAGE_NUM_THREADS"] = str(share)
        else:
            self.threads_from = "PINSTAGE_NUM_THREADS"
        # The pool's size is fixed at its first use: it must be what this rank asked.
        self.threads = _pinstage.default_thread_count()
        if user is None and self.threads != share:
            raise InvalidArgumentError(
                f"pinstage.distributed.setup(): this process fixed its thread count at "
                f"{self.threads} before setup() could set its share ({share} of "
                f"{self.cpus} CPUs for {self.local_world_size} local ranks); call setup() "
                "before any other pinstage load, or set PINSTAGE_NUM_THREADS")
        self.backend = backend
        usable = _usable_devices(backend, worker_options)
        self.devices = local_devices([d.id for d in usable], self.local_rank,
                                     self.local_world_size)
        self.device_numa_node = next(d.numa_node for d in usable if d.id == self.devices[0])
        # A WorkerGroup over the rank's devices: each worker's pinned memory on its device's
        # NUMA node (unless the caller chose one), the rank's threads split over them.
        from .node import WorkerGroup
        self.group = WorkerGroup(backend, list(self.devices), threads=self.threads,
                                 **worker_options)
        self.worker = self.group[0]

    def close(self):
        """Finalizes the rank's workers (refused while tensors of their memory live)."""
        self.group.finalize()

    def __repr__(self):
        return (f"RankContext(rank={self.rank}/{self.world_size}, local_rank="
                f"{self.local_rank}/{self.local_world_size}, devices={self.devices}, "
                f"threads={self.threads} ({self.threads_from}))")


def setup(backend="sim", **worker_options):
    """This rank's RankContext, made once per process over the initialised default
    process group (torch.distributed.init_process_group first): its devices, its Worker
    (`worker_options` as for pinstage.Worker) and its thread share, set as
    PINSTAGE_NUM_THREADS unless the user set that. A second call returns the same one."""
    global _context
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError("pinstage.distributed.setup(): torch.distributed is not "
                                   "initialised; call torch.distributed.init_process_group "
                                   "first")
    if _context is None or _context.worker.finalized:
        _context = RankContext(backend, worker_options)
    elif _context.backend != backend:
        raise InvalidArgumentError(f"pinstage.distributed.setup(): this process is set up "
                                   f"for backend {_context.backend!r}, not {backend!r}")
    return _context


def _plan_text(plan):
    """(JSON text, source for errors) of a plan given as a dict or a plan file's path."""
    if isinstance(plan, dict):
        return json.dumps(plan), "<dict>"
    if isinstance(plan, (str, os.PathLike)):
        path = os.fspath(plan)
        try:
            with open(path, "rb") as f:
                data = f.read(_PLAN_MAX_BYTES + 1)
        except OSError as e:
            raise InvalidArgumentError(f"tp plan '{path}': cannot read it: {e.strerror}") from None
        if len(data) > _PLAN_MAX_BYTES:
            raise InvalidArgumentError(f"tp plan '{path}': larger than {_PLAN_MAX_BYTES} bytes")
        return data.decode("utf-8", "replace"), path
    raise TypeError(f"load_sharded(): plan must be a dict (the pinstage.tp_plan/1 JSON form) "
                    f"or a plan file's path, not {type(plan).__name__}")


# ---- shared-memory segments ("once-per-node") ----

def _job_tag():
    run = os.environ.get("TORCHELASTIC_RUN_ID", "nojob")
    return re.sub(r"[^A-Za-z0-9]", "", run)[:16] or "nojob"


_segments_made = itertools.count()


def _segment_name(tag):
    # The owner's pid comes right after the prefix: sweep_stale_segments reads it. The
    # count keeps two loads of one process apart.
    return f"{SHM_PREFIX}{os.getpid()}-{tag}-{next(_segments_made)}"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_stale_segments(directory=SHM_DIR):
    """Unlinks the segments of `directory` that pinstage.distributed made and whose owner
    process is gone (a rank killed mid-load); returns their names. Live owners' segments
    stay. Every once-per-node load sweeps first."""
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        m = re.match(re.escape(SHM_PREFIX) + r"(\d+)-", name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except FileNotFoundError:  # another rank swept it first
            pass
    return removed


class _Segment:
    """A POSIX shared-memory segment (a file of SHM_DIR) mapped into this process."""

    def __init__(self, path, size, create):
        self.path, self.owner, self.map = path, create, None
        flags = (os.O_RDWR | os.O_CREAT | os.O_EXCL) if create else os.O_RDONLY
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, max(size, 1))
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if create else 0)
            # Populated at the map: the pages are faulted in bulk, not one trap at a time
            # by the reading or copying threads.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.map = mmap.mmap(fd, max(size, 1), flags, prot)
        except BaseException:
            os.close(fd)
            if create:
                os.unlink(path)
            raise
        os.close(fd)

    def close(self):
        if self.map is not None:
            self.map.close()
            self.map = None
        if self.owner:
            self.owner = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _file_layout(slices, file_path):
    """(names, offsets, size) of the tensors of one file laid out in a segment."""
    names, offsets, size = [], [], 0
    for s in sorted((s for s in slices if s["file"] == file_path), key=lambda s: s["offset"]):
        names.append(s["name"])
        offsets.append(size)
        size += (s["full_nbytes"] + _ALIGN - 1) // _ALIGN * _ALIGN
    return names, offsets, size


# ---- the load ----

class ShardedLoad:
    """One rank's share of a checkpoint: .tensors {name: torch tensor of its slice in
    pinned memory}, .device {name: DeviceBuffer} when staged, .slices (each slice's dtype,
    shape, dim, begin, nbytes, file), .report (this rank's counts and seconds). close()
    frees the device and pinned memory (the torch views must be gone)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.slices = []
        self.buffers = []
        self.tensors = {}
        self.device = {}
        self.report = {}

    def close(self):
        self.tensors = {}
        for b in self.device.values():
            b.close()
        self.device = {}
        for b in self.buffers:
            b.close()
        self.buffers = []


class _Phases:
    """Runs a load's phases, each ending with an all_gather of every rank's status."""

    def __init__(self, group, rank):
        self.group, self.rank, self.seconds = group, rank, {}

    def run(self, phase, fn):
        start = time.perf_counter()
        error, value = None, None
        try:
            if _fault_phase == phase:
                raise RuntimeError(f"injected fault in phase '{phase}'")
            value = fn()
        except Exception as e:  # every rank must hear of it, so none waits forever
            error = f"{type(e).__name__}: {e}"
        self.seconds[phase] = time.perf_counter() - start
        statuses = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(statuses, (self.rank, error), group=self.group)
        failures = {r: m for r, m in statuses if m is not None}
        if failures:
            raise RankFailed(phase, failures)
        return value


def _check_read(read):
    if read not in READ_MODES:
        raise InvalidArgumentError(f"load_sharded(): read must be one of {READ_MODES}, "
                                   f"got {read!r}")


def load_sharded(path, plan, group=None, read="own-slices", *, tp=None, stage=True,
                 chunk_bytes=8 << 20, backend="sim", cache="off"):
    """This rank's tensor-parallel share of the checkpoint at `path` under `plan` (a dict of
    the pinstage.tp_plan/1 form, or a plan file's path), in pinned memory of its worker
    and, with `stage`, on its device. `group`: the process group (default: the world);
    `tp`: the plan's "tp", else the group's size, which must be a multiple of it; a
    rank's tp rank is its group rank % tp.

    read="own-slices": each rank reads only the byte ranges its slices need.
    read="once-per-node": the ranks of a node split the files between them, each reading
    its files whole into a shared-memory segment, from which every rank of the node copies
    its slices into its pinned memory: the node reads each file once.

    cache="use": a rank that finds the checkpoint's entry in the restart cache
    (pinstage.cache) reads its slices from the entry; cache="fill" first has one rank per node fill a missing or stale
    entry (fill_cache), so the node reads the disk once per restart only when the entry
    is missing. The report's "cache" is this rank's lookup state.

    Returns a ShardedLoad; raises RankFailed on every rank when any rank fails a phase."""
    _check_read(read)
    cache = _cache.use(cache, "load_sharded")
    ctx = setup(backend)
    group = group if group is not None else dist.group.WORLD
    grank, gsize = dist.get_rank(group), dist.get_world_size(group)
    phases = _Phases(group, ctx.rank)
    out = ShardedLoad(ctx)
    segments = []
    start = time.perf_counter()
    try:
        found = _node_cache(phases, path, cache, group)
        path = found["entry_path"] if found["state"] in ("hit", "filled") else path
        checkpoint, plan_text, source, tp = phases.run(
            "open", lambda: _open(path, plan, tp, gsize, out))
        tp_rank = grank % tp
        phases.run("alloc", lambda: _alloc(checkpoint, plan_text, source, tp, tp_rank, out))
        if read == "own-slices":
            counts = phases.run("read", lambda: _read_own(checkpoint, plan_text, source, tp,
                                                          tp_rank, out, chunk_bytes))
        else:
            counts = _read_once_per_node(phases, checkpoint, plan_text, source, tp, tp_rank,
                                         out, segments, group, chunk_bytes)
        if stage:
            phases.run("stage", lambda: _stage(out))
    except BaseException:
        for s in segments:
            s.close()
        out.close()
        raise
    total = time.perf_counter() - start
    out.report = _report(ctx, read, tp, tp_rank, checkpoint, out, counts, phases.seconds,
                         total)
    out.report["cache"] = found["state"]
    return out


# ---- the restart cache: one filler per node ----

def _is_node_filler(group):
    """Whether this rank fills its node's cache entries: the group's rank of the lowest
    local rank on this node (local rank 0 when the group holds it)."""
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    members = [None] * dist.get_world_size(group)
    dist.all_gather_object(members, (rank - local, local), group=group)
    return local == min(lr for node, lr in members if node == rank - local)


def _node_cache(phases, path, cache, group, dir=None):
    """This rank's lookup of `path` in the cache ({"state": "off"} for cache="off"): with
    "fill", the node's filler fills a missing or stale entry while the other ranks wait
    at the phase's all_gather (every phase ends with one), then every rank looks it up:
    the filler's state is "filled" when it made the entry, the others' "hit". The entry's
    pages go on the filler's device's NUMA node when setup() made this rank's context."""
    if cache == "off":
        return {"state": "off", "key": "", "entry_path": "", "reason": "", "filler": False}
    filler = _is_node_filler(group)
    filled = None
    # The entry's pages on the filler's device's node, when setup() knows it.
    numa = _context.device_numa_node if _context is not None else -1
    if cache == "fill":
        filled = phases.run("cache fill", lambda: _cache.put(path, dir=dir, numa_node=max(
            numa, -1)) if filler else None)
    found = phases.run("cache lookup", lambda: _cache.lookup(path, dir=dir))
    if filled is not None and filled["state"] == "filled" and found["state"] == "hit":
        found = dict(found, state="filled")
    found["filler"] = filler
    return found


def fill_cache(path, group=None, *, dir=None):
    """Makes sure the restart cache holds checkpoint `path` on every node of `group`
    (default: the world), filled once per node: the node's local rank 0 (the lowest local
    rank of the group there) fills a missing or stale entry while the node's other ranks
    wait at a barrier; then every rank looks the entry up, so each can map it
    (pinstage.load_file(path, worker=..., mode="map", cache="use")). A collective: every
    rank of the group calls it. Returns this rank's lookup dict (pinstage.cache.lookup's)
    with "filler" (this rank filled for its node) and state "filled" on the rank that made
    the entry, "hit" on the others; a failed fill raises RankFailed on every rank."""
    group = group if group is not None else dist.group.WORLD
    return _node_cache(_Phases(group, dist.get_rank()), path, "fill", group, dir)


def _open(path, plan, tp, gsize, out):
    plan_text, source = _plan_text(plan)
    checkpoint = _open_checkpoint(path, "load_sharded")
    if tp is None:
        tp = json.loads(plan_text).get("tp", gsize) if plan_text.lstrip().startswith("{") \
            else gsize
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or gsize % tp != 0:
        raise InvalidArgumentError(f"load_sharded(): tp {tp!r} must be a whole number that "
                                   f"divides the group's {gsize} ranks")
    return checkpoint, plan_text, source, tp


def _alloc(checkpoint, plan_text, source, tp, tp_rank, out):
    out.slices = _pinstage._tp_slices(checkpoint, plan_text, source, tp, tp_rank)
    for s in out.slices:
        _torch_dtype(s["dtype"], s["name"])  # refused before any memory is taken
        s["full_nbytes"] = checkpoint.info(s["name"])["nbytes"]
    for s in out.slices:
        out.buffers.append(out.ctx.worker.alloc_pinned_host(max(s["nbytes"], 1)))


def _read_own(checkpoint, plan_text, source, tp, tp_rank, out, chunk_bytes):
    r = _pinstage._read_tp_into(checkpoint, plan_text, source, tp, tp_rank, out.buffers,
                                threads=out.ctx.threads, chunk_bytes=chunk_bytes)
    files = {}
    for s in out.slices:
        files[s["file"]] = files.get(s["file"], 0) + s["nbytes"]
    return {"read_bytes": r["read_bytes"], "files_read": files, "copied_bytes": 0}


def _node_peers(group, ctx):
    """The group ranks of this rank's node, in local-rank order, and this rank's index."""
    members = [None] * dist.get_world_size(group)
    dist.all_gather_object(members, (ctx.node, ctx.local_rank, dist.get_rank(group)),
                           group=group)
    peers = sorted((lr, g) for node, lr, g in members if node == ctx.node)
    mine = [g for _, g in peers].index(dist.get_rank(group))
    return [g for _, g in peers], mine


def _read_once_per_node(phases, checkpoint, plan_text, source, tp, tp_rank, out, segments,
                        group, chunk_bytes):
    """Rounds: in round k the i-th rank of a node reads file k * n + i (n ranks) whole into
    its segment; then every rank of the node copies its slices out of the round's
    segments. A rank's one segment, sized for its largest file, is reused every round (its
    pages faulted once) and unlinked after the last. A node holds at most n files in
    shared memory at once."""
    ctx = out.ctx
    sweep_stale_segments()
    peers, mine = _node_peers(group, ctx)
    n = len(peers)
    files = checkpoint.files
    layouts = {f: _file_layout(out.slices, f) for f in files}
    by_name = {s["name"]: i for i, s in enumerate(out.slices)}
    counts = {"read_bytes": 0, "files_read": {}, "copied_bytes": 0}
    me = dist.get_rank(group)
    mine_files = files[mine::n]
    for k in range((len(files) + n - 1) // n):
        index = k * n + mine

        def read_round():
            if index >= len(files):
                return None
            if not segments:
                size = max(layouts[f][2] for f in mine_files)
                segments.append(_Segment(os.path.join(SHM_DIR, _segment_name(_job_tag())),
                                         size, create=True))
            names, offsets, _ = layouts[files[index]]
            r = _pinstage._read_whole_into(checkpoint, names, segments[0].map, offsets,
                                           threads=ctx.threads, chunk_bytes=chunk_bytes)
            counts["read_bytes"] += r["bytes"]
            counts["files_read"][files[index]] = r["bytes"]
            return segments[0].path

        mine_path = phases.run(f"read {k}", read_round)
        paths = [None] * dist.get_world_size(group)
        dist.all_gather_object(paths, (me, mine_path), group=group)
        round_paths = {g: p for g, p in paths if g in peers and p is not None}

        def copy_round():
            for i, g in enumerate(peers):
                if g not in round_paths:
                    continue
                names, offsets, size = layouts[files[k * n + i]]
                seg = segments[0] if g == me else _Segment(round_paths[g], size, False)
                try:
                    bufs = [out.buffers[by_name[nm]] for nm in names]
                    counts["copied_bytes"] += _pinstage._copy_tp_from(
                        checkpoint, plan_text, source, tp, tp_rank, names, seg.map, offsets,
                        bufs, threads=ctx.threads)
                finally:
                    if g != me:
                        seg.close()

        # Its all_gather is also the barrier before an owner overwrites its segment.
        phases.run(f"copy {k}", copy_round)
    for s in segments:  # every rank of the node has copied the last round: unlinked
        s.close()
    segments.clear()
    return counts


def _stage(out):
    """Every slice onto the rank's device, the copies queued together, then waited."""
    events = []
    for s, b in zip(out.slices, out.buffers):
        out.tensors[s["name"]] = _view(b, s, s["name"])
        if s["nbytes"] > 0:
            d = out.ctx.worker.alloc_device(s["nbytes"])
            out.device[s["name"]] = d
            events.append(out.ctx.worker.copy_to_device_async(d, b))
    for e in events:
        e.wait()


def _report(ctx, read, tp, tp_rank, checkpoint, out, counts, seconds, total):
    if not out.tensors:
        for s, b in zip(out.slices, out.buffers):
            out.tensors[s["name"]] = _view(b, s, s["name"])
    host = sum(s["nbytes"] for s in out.slices)
    read_s = sum(v for k, v in seconds.items() if k.startswith("read"))
    return {
        "rank": ctx.rank, "local_rank": ctx.local_rank, "node": ctx.node,
        "world_size": ctx.world_size, "local_world_size": ctx.local_world_size,
        "devices": ctx.devices, "numa_node": ctx.worker.host_numa_node,
        "threads": ctx.threads, "threads_from": ctx.threads_from,
        "read": read, "tp": tp, "tp_rank": tp_rank,
        "checkpoint_bytes": checkpoint.total_bytes, "host_bytes": host,
        "upload_bytes": sum(s["nbytes"] for s in out.slices if s["name"] in out.device),
        **counts, "seconds": seconds, "read_s": read_s, "total_s": total,
        "host_gbps": host / total / 1e9 if total > 0 else 0.0,
    }


def gather_reports(load, group=None):
    """Every rank's report (list, by group rank), gathered with all_gather_object: a
    collective, so every rank of the group calls it."""
    group = group if group is not None else dist.group.WORLD
    reports = [None] * dist.get_world_size(group)
    dist.all_gather_object(reports, load.report, group=group)
    return reports


def slice_digests(load):
    """{name: xxh3-64 of this rank's slice bytes} (pinstage.xxh3_64 of the pinned memory)."""
    out = {}
    for s, b in zip(load.slices, load.buffers):
        with memoryview(b) as m:
            out[s["name"]] = _pinstage.xxh3_64(m[:s["nbytes"]])
    return out
