#!/usr/bin/python3
"""pinstage against the loaders users pick today, side by side in one run: one Hugging Face
sharded checkpoint into host memory, warm and cold page cache, every load in a fresh
process, beside the floors of the same machine measured in the same run.

    /usr/bin/python3 bench/peers.py [--gib 2] [--rounds 3] [--dir DIR] [--arms A,B,...]
                                    [--modes warm,cold,dropped] [--build build]
                                    [--json FILE] [--quick]

The peers live in the PyPI venv of requirements/peers.txt: run under another interpreter,
the script makes or reuses it (scripts/venv.sh) and runs itself again there. The
checkpoint (--gib GiB of bf16 weights and f32 norms, written by huggingface_hub's
save_torch_state_dict in shards of a quarter of it) goes to --dir, reused when it is
there, or to a temporary folder in /var/tmp removed at the end (not /tmp, which may be
RAM: a cold read must reach the disk).

Fresh processes. Every load runs in a new interpreter (this one, sys.executable), the
script started again as `peers.py --child ARM --child-mode warm|cold --dir DIR --build B`:
the child imports what the arm needs, makes the arm's pinstage worker, warms the shards
(every page resident, checked with mincore) or drops them (fdatasync and
posix_fadvise(DONTNEED), then mincore shows what is left), and only then times the load,
from just before the loader's call to the moment its bytes are complete (for mmap views:
one byte of every page touched). Not timed: the interpreter's start, the imports, the
worker's creation, the warming or dropping, and after the load the digest (xxh3-64 of
every tensor's bytes, which the parent compares with one reference digest of the files)
and the release. The child prints one JSON line: seconds, its rusage over the load
(faults, CPU), the digest, whether the tensors are pinned, pinstage's load report, the
residency and /proc/meminfo's FileHugePages and ShmemHugePages before and after the
warming or dropping. The parent runs each round every arm (and floor) warm and then cold,
in an order rotated each round, and reports the best of --rounds (on a shared machine the
best is the least disturbed run). An arm that raises, exits or loads other bytes is
reported as failed (its error printed) and the run goes on; the exit status is then 1.

The arms:

  safetensors         safetensors.torch.load_file per shard (backend "mmap", the default):
                      its tensors are views of a MAP_PRIVATE mapping of the file, so the
                      timing includes touching one byte of every page (what makes the bytes
                      resident: without it nothing has been read)
  safetensors_pread   load_file(backend="pread"): copies into torch-owned memory
  fastsafetensors     SafeTensorsFileLoader(SingleGroup(), device="cpu", nogds=True):
                      its default O_DIRECT reads, which bypass the page cache (warm is
                      then a disk read too)
  fastsafetensors_buffered  the same with FASTSAFETENSORS_ODIRECT=0 (page-cache reads)
  runai               runai_model_streamer.SafetensorsStreamer().stream_files(shards),
                      every tensor taken from get_tensors() (owned=True: kept, no copy)
  torch_by_hand       per tensor, torch.empty(shape, dtype) and f.readinto() of its bytes
                      (one thread; torch's pin_memory() needs CUDA, absent here)
  pinstage            pinstage.load_file(DIR, worker=w): pinned (sim: mapped, faulted,
                      mlocked), a worker with host_cache_limit_bytes=0, so the load maps
                      fresh memory as the peers' loads do
  pinstage            (its placement is the default: PINSTAGE_HOST_HUGE_PAGES=auto, huge
                      pages where the kernel has free 2 MiB blocks, given up on a stall;
                      the fresh segment faulted by the reader threads as they read)
  pinstage_thp        pinstage with PINSTAGE_HOST_HUGE_PAGES=thp (docs/settings.md): huge
                      pages whether or not free blocks are counted (the stall watch runs)
  pinstage_base       pinstage with PINSTAGE_HOST_HUGE_PAGES=off: 4 KiB pages
  pinstage_tN         pinstage with threads=N readers (N = 1..256), for the thread count
  pinstage_cM         pinstage with chunk_bytes = M MiB (M = 1..1024), for the chunk size
  pinstage_pooled     a second load in one process: the default pinned pool, the child
                      loads once (untimed), frees the tensors, warms or drops the shards
                      again and times the second load, which reuses the first one's pinned
                      pages (what a process that reloads gets; every other arm is a first
                      load)
  pinstage_direct     load_file(direct=True), default worker, first load: O_DIRECT reads
                      (as fastsafetensors' default), which bypass the page cache
  pinstage_map        load_file(mode="map", report=True), default worker: read-only views
                      of the files' page cache pinned in place, nothing copied (pinning
                      makes them resident, so nothing is touched after the call)
  pinstage_device     pinstage.load_to_device(DIR, worker=w) on sim: through the pinned
                      ring into sim device memory (host RAM), host_cache_limit_bytes=0
  pinstage_map_device load_to_device(mode="map"), the same worker: uploaded straight from
                      the pinned file mapping
  pinstage_cache      a restart with the cache's entry present (docs/cache.md): load_file(
                      mode="map", cache="use", report=True), default worker, from an entry
                      on tmpfs (4 KiB pages) that the parent filled once before the rounds
                      (pinstage.cache.put, timed: fill_s); the arm fails unless the report
                      says "hit"
  pinstage_cache_huge the same from an entry on hugetlbfs (2 MiB pages), reserved and
                      mounted by the parent as root (bench/cache_setup.py)
  pinstage_cache_thp  the same from an entry on a tmpfs mounted huge=within_size by the
                      parent as root: 2 MiB shmem pages with no reservation
  pinstage_cache_device, pinstage_cache_huge_device, pinstage_cache_thp_device
                      load_to_device(cache="use") from those entries on sim: uploaded from
                      the entry's registered mapping, no ring; compared with floor_memcpy

Every device arm's worker backs the whole checkpoint's size of sim device memory when it
is made, before the timer (sim config backed_bytes): a card's memory exists before its
first allocation, so the load is timed without sim's first touch of its own pool.

The modes: warm (every shard page resident), cold (each shard dropped with fdatasync and
posix_fadvise(DONTNEED)) and dropped (sync, then `echo 3 > /proc/sys/vm/drop_caches`, as
root: the restart after the page cache's reclaim, which tmpfs and hugetlbfs survive). Each
run's major faults (getrusage) are in the table and the JSON: a hit takes none, map mode on
the dropped files thousands. With a cache arm, a "cache" block compares each cache arm in
each mode with pinstage_map and the best copying peer of that mode (speed-up, major
faults), and each device arm with floor_memcpy.

The floors, each in a fresh process too, interleaved with the arms in every round:

  floor_fault         fresh private anonymous memory of the checkpoint's tensor bytes
                      (mmap), one byte of every 4 KiB page written from os.cpu_count()
                      threads (NumPy strided stores, which release the GIL): GB/s of bytes
                      faulted, what any loader into fresh memory pays at least (THP as the
                      system's setting, printed). Run warm and cold.
  floor_memcpy        an all-core memcpy of the same bytes, source and destination already
                      faulted, np.copyto on one slice per thread (best of 3 copies in the
                      child): the floor of any copy between faulted buffers. Run warm.
  floor_pread         an all-core pread of the shard files into memory already faulted
                      (one slice of the files per thread, 16 MiB reads): what a load that
                      has its memory already (a second load) cannot beat. Run warm; the
                      warm arms' "floor" ratio is to it.
  floor_fio           fio (Debian's package; skipped, and said so, when it is not
                      installed) reading the same shard files, one job per file,
                      --ioengine=libaio --bs=1M --iodepth=32 --rw=read --readonly,
                      group_reporting, read bw of --output-format=json, run twice: O_DIRECT
                      (--direct=1) and buffered (--direct=0, after the shards were dropped
                      again): the disk floor is the better of the two (on this VM buffered
                      read-ahead beats O_DIRECT). Run cold; the cold arms' "floor" ratio is
                      to it.

The Python API loads only into pinned memory (into= refuses pageable tensors), so there is
no pinstage row into pageable memory: on this CPU-only host the pinned row does more than
a pageable load (it also faults and mlocks), and the peers cannot pin at all.

GB/s = 10^9 bytes of tensor data per second. Output: a table with each arm's ratio to the
best copying peer and to the mode's floor, the floors' rows, FILE.json (atomically, with
a `run` block: the CLI's plus every package version, the load average) and FILE.png
beside it.
"""
import argparse
import ctypes
import gc
import importlib.metadata
import inspect
import json
import math
import os
import pathlib
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from benchargs import add_dry_run, dry_run_done, write_json_atomically
from cache_setup import CacheDirs, drop_caches

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEERS = ["safetensors", "safetensors_pread", "fastsafetensors", "fastsafetensors_buffered",
         "runai", "torch_by_hand"]
OURS = ["pinstage", "pinstage_thp", "pinstage_base", "pinstage_pooled", "pinstage_direct",
        "pinstage_map", "pinstage_device", "pinstage_map_device", "pinstage_cache",
        "pinstage_cache_huge", "pinstage_cache_thp", "pinstage_cache_device",
        "pinstage_cache_huge_device", "pinstage_cache_thp_device"]
# The restart cache's arms: the cache directory (bench/cache_setup.py) each loads from.
CACHE_FS = {"pinstage_cache": "tmpfs", "pinstage_cache_device": "tmpfs",
            "pinstage_cache_huge": "hugetlbfs", "pinstage_cache_huge_device": "hugetlbfs",
            "pinstage_cache_thp": "tmpfs_huge", "pinstage_cache_thp_device": "tmpfs_huge"}
# The sweeps: pinstage_tN (threads) and pinstage_cM (chunk MiB), fresh workers.
SWEEP = re.compile(r"pinstage_([tc])(\d+)$")
# safetensors' default gives views of the file's mapping (the page cache itself, faulted in
# as touched), not a copy in the process's memory: it is shown, but the ratios are to the
# best peer that copies the bytes into memory of its own, as every other arm does.
ZERO_COPY = {"safetensors"}
ARMS = PEERS + OURS
# The floors run in these modes; the arms' "floor" ratio of a mode is to FLOOR_OF[mode].
MODES = ("warm", "cold", "dropped")
FLOOR_MODES = {"floor_fault": ("warm", "cold"), "floor_memcpy": ("warm",),
               "floor_pread": ("warm",), "floor_fio": ("cold", "dropped")}
FLOORS = list(FLOOR_MODES)
FLOOR_OF = {"warm": "floor_pread", "cold": "floor_fio", "dropped": "floor_fio"}
LABELS = {"safetensors": "zero-copy views of the page cache",
          "pinstage_pooled": "second load in one process",
          "pinstage_map": "read-only views of the page cache, pinned in place",
          "pinstage_map_device": "uploaded from the pinned file mapping",
          "pinstage_cache": "a hit of the restart cache on tmpfs, mapped in place",
          "pinstage_cache_huge": "a hit of the restart cache on hugetlbfs (2 MiB pages)",
          "pinstage_cache_device": "uploaded from a tmpfs cache hit's mapping",
          "pinstage_cache_huge_device": "uploaded from a hugetlbfs cache hit's mapping",
          "pinstage_cache_thp": "a hit of the restart cache on tmpfs huge=within_size",
          "pinstage_cache_thp_device": "uploaded from a huge tmpfs cache hit's mapping",
          "floor_fault": "fresh anonymous pages, one byte per 4 KiB page, every core",
          "floor_memcpy": "all-core memcpy, both sides already faulted",
          "floor_pread": "all-core pread of the shards into memory already faulted",
          "floor_fio": "fio, the better of O_DIRECT and buffered, 1 MiB blocks, iodepth 32, "
                       "one job per shard"}
# Which worker a pinstage arm loads with: "fresh" maps new memory at every load
# (host_cache_limit_bytes=0), "pooled" is the default Worker().
WORKER = {"pinstage": "fresh", "pinstage_thp": "fresh", "pinstage_base": "fresh",
          "pinstage_device": "fresh",
          "pinstage_map_device": "fresh", "pinstage_pooled": "pooled",
          "pinstage_direct": "pooled", "pinstage_map": "pooled", "pinstage_cache": "pooled",
          "pinstage_cache_huge": "pooled", "pinstage_cache_device": "fresh",
          "pinstage_cache_huge_device": "fresh", "pinstage_cache_thp": "pooled",
          "pinstage_cache_thp_device": "fresh"}
MARK = "peers.py child result: "
GIB = 1 << 30
PAGE = 4096


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size, GiB (2..4 meant)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the best is reported")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of: " +
                    ", ".join(ARMS))
    ap.add_argument("--modes", default="warm,cold",
                    help="of warm, cold, dropped (root: echo 3 > /proc/sys/vm/drop_caches)")
    ap.add_argument("--dir", help="where the checkpoint is (reused) or goes (kept)")
    ap.add_argument("--build", default=os.environ.get("PINSTAGE_BUILD_DIR", "build"))
    ap.add_argument("--json", help="write the report here (and the PNG beside it)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 0.25 GiB, 1 round (figures not meant to be kept)")
    # The child: one load (or floor) in this fresh process, one JSON line on stdout.
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-mode", choices=MODES, help=argparse.SUPPRESS)
    add_dry_run(ap)
    a = ap.parse_args(argv)
    if a.quick:
        a.gib, a.rounds = 0.25, 1
    a.arms = [x.strip().lower() for x in a.arms.split(",") if x.strip()]
    a.modes = [x.strip().lower() for x in a.modes.split(",") if x.strip()]
    unknown = [x for x in a.arms if not known_arm(x)]
    if unknown or not a.arms:
        ap.error(f"--arms: unknown {unknown} (known: {', '.join(ARMS)}, pinstage_tN with N "
                 f"in 1..256, pinstage_cM with M in 1..1024)")
    if a.child and not (known_arm(a.child) or a.child in FLOORS):
        ap.error(f"--child: unknown {a.child!r}")
    if not a.modes or any(m not in MODES for m in a.modes):
        ap.error("--modes: a comma-separated list of warm, cold, dropped")
    if a.rounds < 1 or not 0 < a.gib <= 64:
        ap.error("--rounds must be >= 1 and --gib in (0, 64]")
    if a.json is not None and (not a.json or not pathlib.Path(a.json).resolve().parent.is_dir()):
        ap.error(f"--json {a.json!r}: the folder must exist")
    if a.child and (not a.child_mode or not a.dir):
        ap.error("--child needs --child-mode and --dir")
    return a


def known_arm(name):
    """An arm of ARMS, or a sweep arm in range."""
    m = SWEEP.match(name)
    if m is None:
        return name in ARMS
    n = int(m.group(2))
    return str(n) == m.group(2) and 1 <= n <= (256 if m.group(1) == "t" else 1024)


def worker_of(arm):
    """"fresh" or "pooled" for an arm with a pinstage worker, else None."""
    return "fresh" if SWEEP.match(arm) else WORKER.get(arm)


def into_the_venv():
    """Runs this script again under the peers' venv when this interpreter lacks them."""
    try:
        import fastsafetensors  # noqa: F401
        import runai_model_streamer  # noqa: F401
        import safetensors  # noqa: F401
        return
    except ImportError as e:
        missing = e.name
    venv = subprocess.run([str(ROOT / "scripts/venv.sh")], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.strip()
    python = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        sys.exit(f"peers.py: {missing} is missing from the venv {venv}")
    print(f"peers.py: {missing} is not here; running under {python}", file=sys.stderr)
    os.execv(python, [python, __file__, *sys.argv[1:]])
# --- the checkpoint --------------------------------------------------------------------

def write_checkpoint(d, gib, torch, hub):
    """A llama-like state dict of about `gib` GiB (bf16 matrices, f32 norms, random bytes),
    saved by huggingface_hub in 4 shards, then synced so the page cache holds clean pages
    (only those can be dropped)."""
    hidden, inter = 2048, 5632
    layer = 2 * hidden * (4 * hidden + 3 * inter) + 2 * 4 * hidden
    layers = max(1, round(gib * GIB / layer))
    g = torch.Generator().manual_seed(26)

    def weights(*shape):
        return torch.randint(-2**15, 2**15, shape, dtype=torch.int16, generator=g).view(
            torch.bfloat16)

    sd = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{n}.weight"] = weights(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = weights(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = weights(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = weights(hidden, inter)
        sd[p + "input_layernorm.weight"] = torch.rand(hidden, generator=g)
        sd[p + "post_attention_layernorm.weight"] = torch.rand(hidden, generator=g)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    d.mkdir(parents=True, exist_ok=True)
    hub.save_torch_state_dict(sd, d, max_shard_size=math.ceil(total / 4) + (64 << 20))
    del sd
    os.sync()


def shards(d):
    index = json.loads((d / "model.safetensors.index.json").read_text())
    return [d / s for s in sorted(set(index["weight_map"].values()))]


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return 8 + n, h


def reference_digest(files, pinstage):
    """{name: xxh3-64} of each tensor's bytes, read from the files with plain reads."""
    out = {}
    for f in files:
        base, h = header(f)
        with open(f, "rb") as fh:
            for name, e in h.items():
                b, end = e["data_offsets"]
                fh.seek(base + b)
                out[name] = pinstage.xxh3_64(fh.read(end - b))
    return out


# --- the page cache --------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident(files):
    """(resident bytes, total bytes) of `files` in the page cache, by mincore(2)."""
    page = os.sysconf("SC_PAGE_SIZE")
    have = total = 0
    for f in files:
        size = os.path.getsize(f)
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {f}")
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {f}")
            _libc.munmap(addr, size)
        finally:
            os.close(fd)
        have += sum(v & 1 for v in bytes(vec)) * page
        total += pages * page
    return have, total


def drop(files):
    """Evicts the files from the page cache; returns the fraction still resident."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    have, total = resident(files)
    return have / total


def warm(files):
    """Reads every file once, unless mincore already shows every page resident."""
    have, total = resident(files)
    if have < total:
        buf = bytearray(64 << 20)
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
        have, total = resident(files)
    return have / total


# --- the arms: each returns {name: tensor} (or the device load) -------------------------

def touch(tensors, torch):
    """One byte of every page of every tensor: what makes mmap-backed tensors resident."""
    s = 0
    for t in tensors.values():
        flat = t.reshape(-1).view(torch.uint8)
        s += int(flat[::4096].sum())
    return s


def arm_safetensors(files, ctx, backend=None):
    import safetensors.torch as st
    out = {}
    for f in files:
        out.update(st.load_file(f) if backend is None else st.load_file(f, backend=backend))
    if backend is None:
        touch(out, ctx["torch"])
    return out


def arm_fastsafetensors(files, ctx, direct=True):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    def load():
        loader = SafeTensorsFileLoader(SingleGroup(), device="cpu", nogds=True)
        try:
            loader.add_filenames({0: [str(f) for f in files]})
            fb = loader.copy_files_to_device()
            out = {k: fb.get_tensor(k) for k in loader.get_keys()}
            fb.close()  # owning tensors stay valid (fastsafetensors' file_buffer.close)
            return out
        finally:
            loader.close()
    return with_env("FASTSAFETENSORS_ODIRECT", "1" if direct else "0", load)


def arm_runai(files, ctx):
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as s:
        s.stream_files([str(f) for f in files])
        return dict(s.get_tensors())


def arm_by_hand(files, ctx):
    torch, dtypes = ctx["torch"], ctx["dtypes"]
    out = {}
    for f in files:
        base, h = header(f)
        with open(f, "rb", buffering=0) as fh:
            for name, e in h.items():
                b, end = e["data_offsets"]
                t = torch.empty(e["shape"], dtype=dtypes[e["dtype"]])
                fh.seek(base + b)
                view = memoryview(t.reshape(-1).view(torch.uint8).numpy())
                got = 0
                while got < end - b:
                    n = fh.readinto(view[got:])
                    if not n:
                        raise OSError(f"{f}: short read of {name}")
                    got += n
                out[name] = t
    return out


def with_env(key, value, fn):
    """fn() with os.environ[key] = value (pinstage reads its settings at each mapping)."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def tensor_bytes(files):
    return sum(e["data_offsets"][1] - e["data_offsets"][0]
               for f in files for e in header(f)[1].values())


def huge_folios():
    """/proc/meminfo's FileHugePages and ShmemHugePages, kB: the page cache's huge folios
    (machine-wide), which decide what mapping the page cache in place costs."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("FileHugePages", "ShmemHugePages"):
                out[key + "_kB"] = int(rest.split()[0])
    return out


def prepare(mode, files):
    """Warms or drops the shards; what was resident after, and the huge folios around it."""
    before = huge_folios()
    if mode == "dropped":
        drop_caches()
        have, total = resident(files)
        left = have / total
    else:
        left = drop(files) if mode == "cold" else warm(files)
    return {"resident": left, "folios_before": before, "folios_after": huge_folios()}


# --- the child: one arm or floor in a fresh process -----------------------------------------

def accepts(fn, keyword):
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def arm_context(arm, d, files):
    """What the arm's load and digest need, imported and made before any timing."""
    import torch
    ctx = {"dir": d, "files": files, "torch": torch,
           "dtypes": {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8,
                      "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
                      "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                      "F64": torch.float64}}
    import pinstage
    # The loaders' module too: pinstage imports it on first use, and compiling it (where no
    # bytecode is cached: PYTHONDONTWRITEBYTECODE) took ~10 ms inside the timer.
    import pinstage.checkpoint  # noqa: F401
    ctx["pinstage"] = pinstage
    if worker_of(arm):
        if arm in ("pinstage_thp", "pinstage_base"):  # the one switch, read at Worker()
            os.environ["PINSTAGE_HOST_HUGE_PAGES"] = "thp" if arm == "pinstage_thp" else "off"
        kw = {"host_cache_limit_bytes": 0} if worker_of(arm) == "fresh" else {}
        if is_device(arm):  # sim's pool backed now, as a card's memory exists already
            kw["config"] = {"backed_bytes": str(sum(f.stat().st_size for f in files))}
        ctx["worker"] = pinstage.Worker(**kw)
        # The load report where load_file offers it (report=True returns (tensors, report)).
        ctx["report_kw"] = {"report": True} if accepts(pinstage.load_file, "report") else {}
    elif arm.startswith("safetensors"):
        import safetensors.torch  # noqa: F401
    elif arm.startswith("fastsafetensors"):
        import fastsafetensors  # noqa: F401
    elif arm == "runai":
        import runai_model_streamer  # noqa: F401
    return ctx


def loader(arm, ctx):
    """The arm's load, a function of no arguments returning {name: tensor}, (tensors,
    report) or a DeviceLoad."""
    d, files = ctx["dir"], ctx["files"]
    ps, w, kw = ctx["pinstage"], ctx.get("worker"), ctx.get("report_kw", {})
    sweep = SWEEP.match(arm)
    if sweep:
        n = int(sweep.group(2))
        knob = {"threads": n} if sweep.group(1) == "t" else {"chunk_bytes": n << 20}
        return lambda: ps.load_file(d, worker=w, **knob, **kw)
    return {
        "safetensors": lambda: arm_safetensors(files, ctx),
        "safetensors_pread": lambda: arm_safetensors(files, ctx, "pread"),
        "fastsafetensors": lambda: arm_fastsafetensors(files, ctx, True),
        "fastsafetensors_buffered": lambda: arm_fastsafetensors(files, ctx, False),
        "runai": lambda: arm_runai(files, ctx),
        "torch_by_hand": lambda: arm_by_hand(files, ctx),
        "pinstage": lambda: ps.load_file(d, worker=w, **kw),
        "pinstage_thp": lambda: ps.load_file(d, worker=w, **kw),
        "pinstage_base": lambda: ps.load_file(d, worker=w, **kw),
        "pinstage_pooled": lambda: ps.load_file(d, worker=w, **kw),
        "pinstage_direct": lambda: ps.load_file(d, worker=w, direct=True, **kw),
        "pinstage_map": lambda: ps.load_file(d, worker=w, mode="map", report=True),
        "pinstage_device": lambda: ps.load_to_device(d, worker=w),
        "pinstage_map_device": lambda: ps.load_to_device(d, worker=w, mode="map"),
        "pinstage_cache": lambda: ps.load_file(d, worker=w, mode="map", cache="use",
                                               report=True),
        "pinstage_cache_huge": lambda: ps.load_file(d, worker=w, mode="map", cache="use",
                                                    report=True),
        "pinstage_cache_device": lambda: ps.load_to_device(d, worker=w, cache="use"),
        "pinstage_cache_huge_device": lambda: ps.load_to_device(d, worker=w, cache="use"),
        "pinstage_cache_thp": lambda: ps.load_file(d, worker=w, mode="map", cache="use",
                                                   report=True),
        "pinstage_cache_thp_device": lambda: ps.load_to_device(d, worker=w, cache="use"),
    }[arm]


def is_device(arm):
    return arm.endswith("_device")


def split_report(got, arm):
    """(what was loaded, pinstage's load report or None)."""
    if isinstance(got, tuple):
        return got
    if is_device(arm):
        return got, dict(got.report)
    return got, None


def digest(got, arm, ctx):
    """{name: xxh3-64} of what an arm loaded."""
    x = ctx["pinstage"].xxh3_64
    if is_device(arm):
        return {n: x(got.to_bytes(n)) for n in got.keys()}
    torch = ctx["torch"]
    return {n: x(t.reshape(-1).view(torch.uint8).numpy()) for n, t in got.items()}


def pinned_state(got, arm, ctx):
    """Whether the arm's tensors are in pinned memory: pinstage's or torch's own."""
    if is_device(arm):
        return "device"
    t = next(iter(got.values()))
    try:
        return bool(ctx["pinstage"].is_pinned(t) or (ctx["torch"].cuda.is_available() and
                                                      t.is_pinned()))
    except Exception as e:  # a tensor kind is_pinned does not know yet
        return f"unknown ({type(e).__name__}: {e})"


def close_device(got, arm):
    """A device load's buffers freed now (host tensors go with their last reference)."""
    if is_device(arm):
        (got[0] if isinstance(got, tuple) else got).close()


def usage_between(r0, r1):
    return {"minor_faults": r1.ru_minflt - r0.ru_minflt,
            "major_faults": r1.ru_majflt - r0.ru_majflt,
            "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
            "sys_s": r1.ru_stime - r0.ru_stime}


def child_arm(arm, mode, files, d):
    """One timed load of `arm` in this process (pinstage_pooled: the second of two)."""
    ctx = arm_context(arm, d, files)
    load = loader(arm, ctx)
    if arm == "pinstage_pooled":  # the first load fills the pool; the second is timed
        first = load()
        del first  # its pinned pages go back to the pool, for the second load to reuse
        gc.collect()
    cache = prepare(mode, files)
    gc.collect()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    got = load()
    seconds = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    tensors, report = split_report(got, arm)
    if arm in CACHE_FS and report.get("cache") != "hit":
        raise RuntimeError(f"{arm}: the load was a cache {report.get('cache')!r} "
                           f"({report.get('cache_note', '')}), not a hit of the entry in "
                           f"{os.environ.get('PINSTAGE_CACHE_DIR')}")
    out = {"ok": True, "seconds": seconds, "usage": usage_between(r0, r1),
           "digest": digest(tensors, arm, ctx), "pinned": pinned_state(tensors, arm, ctx),
           "report": report, **cache}
    close_device(got, arm)
    del tensors, got
    gc.collect()
    if "worker" in ctx:
        ctx["worker"].finalize()
    return out
# --- the floors ------------------------------------------------------------------------------

def in_threads(fn, n, threads, align=PAGE):
    """fn(lo, hi) on `threads` slices of [0, n) aligned to `align`, one thread each;
    seconds."""
    step = -(-n // threads // align) * align
    parts = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    ts = [threading.Thread(target=fn, args=p) for p in parts]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def thp_setting():
    try:
        text = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        return text.split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unknown"


def floor_fault(n, threads):
    """Fresh private anonymous pages, one byte of each 4 KiB page written by every core."""
    import mmap

    import numpy as np
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    r0 = resource.getrusage(resource.RUSAGE_SELF)

    def touch_pages(lo, hi):
        a[lo:hi:PAGE] = 1  # a strided store: NumPy releases the GIL over it

    seconds = in_threads(touch_pages, n, threads)
    u = usage_between(r0, resource.getrusage(resource.RUSAGE_SELF))
    del a
    m.close()
    return {"seconds": seconds, "gbps": n / seconds / 1e9, "usage": u,
            "thp": thp_setting()}


def floor_memcpy(n, threads, copies=3):
    """An all-core copy of n bytes between already-faulted buffers; the best of `copies`."""
    import numpy as np
    src = np.ones(n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)

    def copy(lo, hi):
        np.copyto(dst[lo:hi], src[lo:hi])  # releases the GIL

    best = min(in_threads(copy, n, threads) for _ in range(copies))
    if not np.array_equal(dst[::PAGE], src[::PAGE]):
        raise RuntimeError("floor_memcpy: the copy differs from its source")
    return {"seconds": best, "gbps": n / best / 1e9, "copies": copies}


def floor_pread(files, n, threads, chunk=16 << 20):
    """Every shard's bytes read with os.preadv into one faulted buffer, the files' byte
    ranges split across `threads` threads (GIL released in the read)."""
    import numpy as np
    buf = np.ones(sum(os.path.getsize(f) for f in files), dtype=np.uint8)
    ranges, at = [], 0
    for f in files:
        size = os.path.getsize(f)
        ranges += [(f, off, min(chunk, size - off), at + off) for off in range(0, size, chunk)]
        at += size
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    view = memoryview(buf)

    def read(lo, hi):
        for f, off, length, dst in ranges[lo:hi]:
            os.preadv(fds[f], [view[dst:dst + length]], off)

    try:
        seconds = in_threads(read, len(ranges), threads, align=1)
    finally:
        for fd in fds.values():
            os.close(fd)
    return {"seconds": seconds, "gbps": buf.size / seconds / 1e9, "file_bytes": int(buf.size)}


def fio_command(files, direct):
    cmd = ["fio", "--output-format=json", "--ioengine=libaio", f"--direct={int(direct)}",
           "--bs=1M", "--iodepth=32", "--rw=read", "--readonly", "--group_reporting"]
    for i, f in enumerate(files):
        cmd += [f"--name=shard{i}", f"--filename={f}"]
    return cmd


def fio_read(files, direct):
    cmd = fio_command(files, direct)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"fio exited {done.returncode}: {done.stderr.strip()[-400:]}")
    text = done.stdout[done.stdout.index("{"):]  # fio may print notes before the JSON
    read = json.loads(text)["jobs"][0]["read"]
    if not read["bw_bytes"]:
        raise RuntimeError("fio read nothing")
    return {"gbps": read["bw_bytes"] / 1e9, "seconds": read["runtime"] / 1e3,
            "bytes": read["io_bytes"], "command": " ".join(cmd[:9]) + " --name=shardI ..."}


def floor_fio(files):
    """fio's read of the (dropped) shards, O_DIRECT and buffered: the better of the two."""
    direct = fio_read(files, True)
    drop(files)  # buffered reads fill the page cache: start it cold too
    buffered = fio_read(files, False)
    best = max((direct, buffered), key=lambda r: r["gbps"])
    return {"gbps": best["gbps"], "seconds": best["seconds"], "bytes": best["bytes"],
            "direct_gbps": direct["gbps"], "buffered_gbps": buffered["gbps"],
            "best": "O_DIRECT" if best is direct else "buffered",
            "fio": subprocess.run(["fio", "--version"], capture_output=True,
                                  text=True).stdout.strip(),
            "command": best["command"]}


def child_floor(floor, mode, files):
    cache = prepare(mode, files)
    n, threads = tensor_bytes(files), os.cpu_count() or 1
    if floor == "floor_fault":
        out = floor_fault(n, threads)
    elif floor == "floor_memcpy":
        out = floor_memcpy(n, threads)
    elif floor == "floor_pread":
        out = floor_pread(files, n, threads)
    else:
        out = floor_fio(files)
    return {"ok": True, "bytes": out.pop("bytes", n), "threads": threads, **out, **cache}


def child_main(a):
    """--child: one arm or floor, its result as one JSON line on stdout; 1 if it failed."""
    sys.path.insert(0, str(pathlib.Path(a.build).resolve() / "python"))
    d = pathlib.Path(a.dir).resolve()
    try:
        files = shards(d)
        if a.child in FLOORS:
            result = child_floor(a.child, a.child_mode, files)
        else:
            result = child_arm(a.child, a.child_mode, files, d)
    except Exception as e:
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(MARK + json.dumps(result, default=str), flush=True)
    return 0 if result["ok"] else 1
# --- the parent: rounds of fresh processes ---------------------------------------------------

def prepare_checkpoint(a):
    """(the checkpoint's folder, the TemporaryDirectory to clean up or None); written when
    the folder has none."""
    tmp = None
    if a.dir:
        d = pathlib.Path(a.dir).resolve()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="pinstage-peers-", dir="/var/tmp")
        d = pathlib.Path(tmp.name)
    if not (d / "model.safetensors.index.json").exists():
        import huggingface_hub as hub
        import torch
        t0 = time.perf_counter()
        write_checkpoint(d, a.gib, torch, hub)
        print(f"wrote the checkpoint in {time.perf_counter() - t0:.1f} s: {d}", flush=True)
    return d, tmp


def jobs_of(a):
    """{mode: the arms and floors run in it}; fio's floor only where fio is installed."""
    have_fio = shutil.which("fio") is not None
    if not have_fio and "cold" in a.modes:
        print("peers.py: fio is not installed (Debian: apt-get install -y fio): the fio "
              "floor (O_DIRECT, 1 MiB, iodepth 32) is SKIPPED; cold ratios to it are absent",
              flush=True)
    floors = [f for f in FLOORS if f != "floor_fio" or have_fio]
    return {m: a.arms + [f for f in floors if m in FLOOR_MODES[f]] for m in a.modes}


def run_child(job, mode, d, build, timeout, caches=None):
    """One fresh process for (job, mode); its JSON result ({"ok": False, "error"} if none).
    A cache arm's child gets PINSTAGE_CACHE_DIR: its kind of `caches` (a CacheDirs)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", job, "--child-mode", mode,
           "--dir", str(d), "--build", str(build)]
    env = dict(os.environ)
    if job in CACHE_FS:
        kind = CACHE_FS[job]
        if kind not in caches.dirs:
            return {"ok": False, "error": caches.errors.get(kind, f"no {kind} cache")}
        env["PINSTAGE_CACHE_DIR"] = caches.dirs[kind]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no result within {timeout:.0f} s (killed)"}
    lines = [x for x in done.stdout.splitlines() if x.startswith(MARK)]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        return {"ok": False, "error": f"the child exited {done.returncode} with no result: "
                                      f"{tail}"}
    return json.loads(lines[-1][len(MARK):])


def check_digest(result, ref):
    """Replaces the child's digest with digest_ok; a mismatch fails the run."""
    got = result.pop("digest", None)
    if not result["ok"] or got is None:
        return
    result["digest_ok"] = got == ref
    if got != ref:
        differ = sum(got.get(n) != h for n, h in ref.items()) + len(set(got) - set(ref))
        result.update(ok=False, error=f"loaded other bytes than the files hold ({differ} of "
                                      f"{len(ref)} tensors differ or are missing)")


def short(error, limit=300):
    """An error's first `limit` characters (the JSON report keeps it whole)."""
    return error if len(error) <= limit else error[:limit] + f"... ({len(error)} characters)"


def say_run(r, mode, job, res, nbytes):
    head = f"round {r + 1} {mode:4} {job:24}"
    if not res["ok"]:
        print(f"{head} FAILED: {short(res['error'])}", file=sys.stderr, flush=True)
        return
    if job in FLOORS:
        how = "fio" if job == "floor_fio" else f"{res['threads']} threads"
        print(f"{head} {res['seconds']:7.3f} s {res['gbps']:6.2f} GB/s  (floor, {how})",
              file=sys.stderr, flush=True)
        return
    u, s = res["usage"], res["seconds"]
    rep = res.get("report") or {}
    keys = [k for k in ("mode", "map_s", "pin_s", "alloc_s", "read_s") if k in rep]
    note = ("  report: " + " ".join(f"{k}={rep[k]:.3f}" if isinstance(rep[k], float)
                                    else f"{k}={rep[k]}" for k in keys)) if keys else ""
    print(f"{head} {s:7.3f} s {nbytes / s / 1e9:6.2f} GB/s  CPU {u['cpu_s']:6.2f} s "
          f"(sys {u['sys_s']:5.2f}), {u['minor_faults']:7d} minor, {u['major_faults']:6d} "
          f"major faults  "
          f"(resident before: {res['resident']:.1%}){note}", file=sys.stderr, flush=True)


def say_folios(mode, res):
    """The page cache's huge folios around the first child's warming or dropping."""
    b, f = res["folios_before"], res["folios_after"]
    what = "warming" if mode == "warm" else "dropping"
    print(f"page cache folios, {mode}: FileHugePages {b.get('FileHugePages_kB')} -> "
          f"{f.get('FileHugePages_kB')} kB, ShmemHugePages {b.get('ShmemHugePages_kB')} -> "
          f"{f.get('ShmemHugePages_kB')} kB (/proc/meminfo, machine-wide, before and after "
          f"{what} the shards)", flush=True)


def run_rounds(a, d, build, ref, nbytes, caches=None):
    """{job: {mode: [child results]}}: every round, each mode, the jobs rotated."""
    jobs = jobs_of(a)
    runs = {j: {m: [] for m in a.modes} for m in a.modes for j in jobs[m]}
    timeout = 300 + 240 * a.gib
    folios = {}
    for r in range(a.rounds):
        for mode in a.modes:
            js = jobs[mode]
            for job in js[r % len(js):] + js[:r % len(js)]:
                res = run_child(job, mode, d, build, timeout, caches)
                check_digest(res, ref)
                res["round"] = r + 1
                if mode not in folios and "folios_before" in res:
                    folios[mode] = {"before": res["folios_before"],
                                    "after": res["folios_after"]}
                    say_folios(mode, res)
                say_run(r, mode, job, res, nbytes)
                runs[job][mode].append(res)
    return runs, folios
def fill_caches(caches, pinstage, d):
    """The cache arms' directories made and filled, before any round (not timed by them)."""
    if not caches.kinds:
        return
    caches.make(d)
    caches.fill(pinstage, d)
    for kind, f in caches.fills.items():
        print(f"cache on {kind}: {f['dir']}, filled in {f['seconds']:.2f} s ({f['state']}; "
              f"page {f['info']['page_bytes']} B)", flush=True)
    for kind, why in caches.errors.items():
        print(f"cache on {kind}: {why}; its arms are FAILED", flush=True)


def cache_summary(a, runs, s):
    """Each cache arm's best run in each mode against pinstage_map and the mode's best
    copying peer (speed-up: their seconds / its seconds; major faults of each), and each
    cache device arm's GB/s against floor_memcpy (warm): the whole load's, and its upload's
    alone (bytes / upload_s: sim's device memory is host RAM faulted on first use, which
    alloc_s counts as device_first_touch_s; a device's memory is not)."""
    out = {}
    memcpy = s["floors_gbps"].get("floor_memcpy", {}).get("warm")
    for arm in (x for x in a.arms if x in CACHE_FS):
        for m in a.modes:
            mine = best_run(runs, arm, m)
            if mine is None:
                continue
            row = {"seconds": mine["seconds"], "major_faults": mine["usage"]["major_faults"]}
            if is_device(arm):
                gbps, rep = s["best_gbps"][arm][m], mine.get("report") or {}
                upload = rep["bytes"] / rep["upload_s"] / 1e9 if rep.get("upload_s") else None
                row.update(gbps=gbps, floor_memcpy_gbps=memcpy, upload_gbps=upload,
                           to_memcpy=gbps / memcpy if memcpy else None,
                           upload_to_memcpy=upload / memcpy if memcpy and upload else None,
                           device_first_touch_s=rep.get("device_first_touch_s"))
            others = [("pinstage_map", best_run(runs, "pinstage_map", m))]
            if m in s["best_peer"]:
                others.append((s["best_peer"][m], best_run(runs, s["best_peer"][m], m)))
            for name, other in others:
                if other is not None and not is_device(arm):
                    row[name] = {"seconds": other["seconds"],
                                 "speedup": other["seconds"] / mine["seconds"],
                                 "major_faults": other["usage"]["major_faults"]}
            out.setdefault(arm, {})[m] = row
    return out


def print_cache(summary):
    for arm, by in summary.items():
        for m, row in by.items():
            line = f"cache {m:7} {arm:26} {row['seconds']:7.3f} s, {row['major_faults']} major"
            if "gbps" in row:
                ratio = f"{row['to_memcpy']:.2f}x" if row["to_memcpy"] else "-"
                up = (f"{row['upload_gbps']:.2f} GB/s = {row['upload_to_memcpy']:.2f}x"
                      if row["upload_to_memcpy"] else "-")
                line += (f"; cache hit -> device {row['gbps']:.2f} GB/s = {ratio} floor_memcpy "
                         f"({row['floor_memcpy_gbps'] or 0:.2f} GB/s), the upload alone {up} "
                         f"(sim's first touch of its device memory: "
                         f"{row['device_first_touch_s'] or 0:.3f} s)")
            for name, o in row.items():
                if isinstance(o, dict):
                    line += (f"; {o['speedup']:.1f}x faster than {name} ({o['seconds']:.3f} s, "
                             f"{o['major_faults']} major)")
            print(line)


# --- the report --------------------------------------------------------------------------

def best_run(runs, job, mode):
    """The best successful run of (job, mode): the fastest load, the floor's highest GB/s."""
    ok = [r for r in runs.get(job, {}).get(mode, []) if r["ok"]]
    if not ok:
        return None
    if job in FLOORS:
        return max(ok, key=lambda r: r["gbps"])
    return min(ok, key=lambda r: r["seconds"])


def summarize(a, runs, nbytes):
    """GB/s of every arm's and floor's best run, the best copying peer per mode, and each
    arm's ratios to that peer and to the mode's floor (warm: memcpy, cold: fio)."""
    best = {arm: {} for arm in a.arms}
    floors = {f: {} for f in FLOORS if f in runs}
    for m in a.modes:
        for arm in a.arms:
            b = best_run(runs, arm, m)
            if b is not None:
                best[arm][m] = nbytes / b["seconds"] / 1e9
        for f in floors:
            b = best_run(runs, f, m)
            if b is not None:
                floors[f][m] = b["gbps"]
    peers = [x for x in a.arms if x in PEERS and x not in ZERO_COPY]
    best_peer = {}
    for m in a.modes:
        have = [x for x in peers if m in best[x]]
        if have:
            best_peer[m] = max(have, key=lambda x: best[x][m])
    to_peer = {arm: {m: v / best[best_peer[m]][m] for m, v in by.items() if m in best_peer}
               for arm, by in best.items()}
    to_floor = {arm: {m: v / floors[FLOOR_OF[m]][m] for m, v in by.items()
                      if m in floors.get(FLOOR_OF[m], {})} for arm, by in best.items()}
    return {"best_gbps": best, "floors_gbps": floors, "best_peer": best_peer,
            "ratio_to_best_peer": to_peer, "ratio_to_floor": to_floor}


def cell(a, runs, s, arm, m):
    if m not in s["best_gbps"][arm]:
        failed = any(not r["ok"] for r in runs[arm][m])
        return f"{'FAILED' if failed else '-':>11}" + " " * 37
    b = best_run(runs, arm, m)
    peer = s["ratio_to_best_peer"][arm].get(m)
    floor = s["ratio_to_floor"][arm].get(m)
    return (f"{s['best_gbps'][arm][m]:11.2f}" + (f"{peer:6.2f}x" if peer else f"{'-':>7}") +
            (f"{floor:6.2f}x" if floor else f"{'-':>7}") +
            f"{b['usage']['minor_faults']:9d}{b['usage']['major_faults']:7d}"
            f"{b['usage']['cpu_s']:7.2f}")


def print_table(a, runs, s, nbytes, files):
    bp = s["best_peer"]
    print(f"\n{nbytes / 1e9:.2f} GB in {len(files)} shards, into host memory, each load in a "
          f"fresh process, best of {a.rounds}; peer = GB/s / the best copying peer's (warm: "
          f"{bp.get('warm', '-')}, cold: {bp.get('cold', '-')}); floor = GB/s / the "
          f"mode's floor (warm: floor_pread, cold and dropped: floor_fio); minor and major "
          f"faults and CPU seconds of the best run")
    print(f"{'arm':26}" + "".join(f"{m + ' GB/s':>11}{'peer':>7}{'floor':>7}{'faults':>9}"
                                  f"{'major':>7}{'CPU s':>7}" for m in a.modes) + "  pinned")
    for arm in a.arms:
        pinned = next((r["pinned"] for m in a.modes for r in runs[arm][m] if r["ok"]), "-")
        note = f"  ({LABELS[arm]})" if arm in LABELS else ""
        print(f"{arm:26}" + "".join(cell(a, runs, s, arm, m) for m in a.modes) +
              f"  {pinned}{note}")
    for f, by in s["floors_gbps"].items():
        cells = "".join((f"{by[m]:11.2f}" if m in by else f"{'-':>11}") + " " * 37
                        for m in a.modes)
        b = next((best_run(runs, f, m) for m in a.modes if m in by), None) or {}
        how = f", {b['threads']} threads" if f != "floor_fio" and "threads" in b else ""
        how += f", THP {b['thp']}" if "thp" in b else ""
        print(f"{f:26}{cells}  ({LABELS[f]}{how})")
    if "floor_fio" not in s["floors_gbps"] and "cold" in a.modes:
        print("floor_fio: SKIPPED, fio is not installed (apt-get install -y fio)")
    for job, by in runs.items():
        for m, rs in by.items():
            for r in rs:
                if not r["ok"]:
                    print(f"FAILED: {job} ({m}, round {r['round']}): {short(r['error'])}")


def print_residency(runs, a):
    arms = [r for arm in a.arms for m in ("cold",) if m in a.modes
            for r in runs[arm][m] if "resident" in r]
    if arms:
        print(f"cold arms: at most {max(r['resident'] for r in arms):.2%} of the shards "
              "resident before an arm")
    arms = [r for arm in a.arms for m in ("warm",) if m in a.modes
            for r in runs[arm][m] if "resident" in r]
    if arms:
        print(f"warm arms: at least {min(r['resident'] for r in arms):.2%} resident before "
              "an arm")


def run_block(a, build, extra):
    """The CLI's run block (pinstage info), plus the interpreter and every package."""
    done = subprocess.run([str(build / "bin" / "pinstage"), "info", "--json", "-", "-q"],
                          capture_output=True, text=True, check=True)
    run = json.loads(done.stdout)["run"]
    run["options"] = {"command": "bench/peers.py", **{k: v for k, v in vars(a).items()}}
    run["python"] = sys.version.split()[0]
    run["executable"] = sys.executable
    run["packages"] = {d.metadata["Name"]: d.version
                       for d in sorted(importlib.metadata.distributions(),
                                       key=lambda d: d.metadata["Name"].lower())}
    run.update(extra)
    return run
TIMED = ("each load in a fresh process; timed from just before the loader's call to its "
         "bytes being complete (mmap views touched); not timed: interpreter start, imports, "
         "worker creation, warming or dropping the page cache, digest, release")


def document(a, runs, s, facts, folios):
    """The JSON report: the summary, every run, the failures, the floors."""
    arms = a.arms
    ok = {j: {m: [r for r in rs if r["ok"]] for m, rs in by.items()} for j, by in runs.items()}
    best_reports = {}
    for arm in arms:
        for m in a.modes:
            b = best_run(runs, arm, m)
            if b is not None and b.get("report") is not None:
                best_reports.setdefault(arm, {})[m] = b["report"]
    return {
        **facts, "kind": "peers", "rounds": a.rounds, "modes": a.modes, "fresh_process": True,
        "timed": TIMED,
        "labels": {k: v for k, v in LABELS.items() if k in runs},
        "seconds": {arm: {m: [r["seconds"] for r in ok[arm][m]] for m in a.modes}
                    for arm in arms},
        "usage": {arm: {m: [r["usage"] for r in ok[arm][m]] for m in a.modes}
                  for arm in arms},
        "zero_copy_arms": sorted(ZERO_COPY & set(arms)),
        "pinned": {arm: next((r["pinned"] for m in a.modes for r in ok[arm][m]), None)
                   for arm in arms},
        "residency_before_arm": {m: [r["resident"] for arm in arms for r in runs[arm][m]
                                     if "resident" in r] for m in a.modes},
        "reports": best_reports,
        "floor_of_mode": {m: FLOOR_OF[m] for m in a.modes},
        "floor_runs": {f: {m: rs for m, rs in by.items() if rs}
                       for f, by in runs.items() if f in FLOORS},
        "fio_installed": shutil.which("fio") is not None,
        "page_cache_folios": folios,
        "failed": {j: {m: [r["error"] for r in rs if not r["ok"]] for m, rs in by.items()
                       if any(not r["ok"] for r in rs)}
                   for j, by in runs.items() if any(not r["ok"] for rs in by.values()
                                                    for r in rs)},
        **s,
    }


def picture(doc, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pinstage.plot import save_atomically
    arms = list(doc["best_gbps"])
    modes = doc["modes"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(modes)
    colors = {"warm": "#d62728", "cold": "#1f77b4", "dropped": "#2ca02c"}
    for k, m in enumerate(modes):
        xs = [i + (k - (len(modes) - 1) / 2) * width for i in range(len(arms))]
        ys = [doc["best_gbps"][arm].get(m, 0.0) for arm in arms]
        ax.bar(xs, ys, width, label=f"{m} page cache", color=colors[m],
               edgecolor=["black" if arm in OURS else "none" for arm in arms])
        floor = doc["floor_of_mode"].get(m)
        gbps = doc["floors_gbps"].get(floor, {}).get(m)
        if gbps:
            ax.axhline(gbps, color=colors[m], linestyle="--", linewidth=1,
                       label=f"{floor} ({m}): {gbps:.2f}")
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels(arms, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("GB/s (10^9 bytes/s), best of %d" % doc["rounds"])
    ax.set_title(f"{doc['bytes'] / 1e9:.2f} GB HF sharded checkpoint into host memory "
                 f"({doc['shards']} shards), fresh processes; pinstage outlined",
                 fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    save_atomically(fig, out)


def write_report(a, doc):
    write_json_atomically(a.json, doc)
    png = str(pathlib.Path(a.json).with_suffix(".png"))
    try:
        picture(doc, png)
        print(f"report: {a.json}, picture: {png}")
    except ImportError as e:
        print(f"report: {a.json} (no picture: {e})")


def say_load(when):
    la = os.getloadavg()
    print(f"load average {when} {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}, {os.cpu_count()} CPUs",
          flush=True)
    return la


def main(argv=None):
    a = parse_args(argv)
    if dry_run_done(a):
        return 0
    if a.child:
        return child_main(a)
    into_the_venv()
    build = pathlib.Path(a.build).resolve()
    sys.path.insert(0, str(build / "python"))
    import pinstage

    load_start = say_load("at start")
    d, tmp = prepare_checkpoint(a)
    try:
        files = shards(d)
        nbytes = tensor_bytes(files)
        warm(files)
        ref = reference_digest(files, pinstage)
        print(f"checkpoint: {nbytes / 1e9:.3f} GB of tensors, {len(ref)} tensors, "
              f"{len(files)} shards; every arm and floor in a fresh process", flush=True)
        with CacheDirs(sorted({CACHE_FS[x] for x in a.arms if x in CACHE_FS})) as caches:
            fill_caches(caches, pinstage, d)
            runs, folios = run_rounds(a, d, build, ref, nbytes, caches)
        facts = {"bytes": nbytes, "file_bytes": sum(os.path.getsize(f) for f in files),
                 "shards": len(files), "tensors": len(ref),
                 "cache_fill": caches.fills, "cache_errors": caches.errors}
    finally:
        if tmp is not None:
            tmp.cleanup()
    s = summarize(a, runs, nbytes)
    s["cache"] = cache_summary(a, runs, s)
    print_table(a, runs, s, nbytes, files)
    print_residency(runs, a)
    print_cache(s["cache"])
    load_end = say_load("at the end")
    if a.json:
        facts["run"] = run_block(a, build, {"load_average_start": load_start,
                                            "load_average_end": load_end})
        write_report(a, document(a, runs, s, facts, folios))
    failed = any(not r["ok"] for by in runs.values() for rs in by.values() for r in rs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
