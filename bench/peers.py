#!/usr/bin/python3
"""pinstage against the loaders users pick today, side by side in one run: one Hugging Face
sharded checkpoint into host memory, warm and cold page cache.

    /usr/bin/python3 bench/peers.py [--gib 2] [--rounds 3] [--dir DIR] [--arms A,B,...]
                                    [--build build] [--json FILE] [--quick]

The peers live in the PyPI venv of requirements/peers.txt: run under another interpreter,
the script makes or reuses it (scripts/venv.sh) and runs itself again there. The
checkpoint (--gib GiB of bf16 weights and f32 norms, written by huggingface_hub's
save_torch_state_dict in shards of a quarter of it) goes to --dir, reused when it is
there, or to a temporary folder in /var/tmp removed at the end (not /tmp, which may be
RAM: a cold read must reach the disk).

Each round runs every arm warm (every page of every shard resident, checked with mincore)
and cold (posix_fadvise(DONTNEED) on every shard, then mincore shows what is left), the
arms' order rotated each round; the best of --rounds is reported (on a shared machine the
best is the least disturbed run). The arms:

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
  pinstage            pinstage.load_file(DIR, worker=w): pinned (sim: mapped, pre-faulted,
                      mlocked), a worker with host_cache_limit_bytes=0, so every load maps
                      fresh memory as the peers' loads do
  pinstage_thp        pinstage with PINSTAGE_HOST_HUGE_PAGES=thp (docs/settings.md): its
                      fresh pinned segments advised MADV_HUGEPAGE, 2 MiB faults instead of
                      4 KiB ones (runai's buffer gets transparent huge pages on its own)
  pinstage_pooled     the same with the default pinned pool: a later load reuses the
                      first one's pinned pages (what a process that reloads gets)
  pinstage_direct     pinstage_pooled with direct=True: O_DIRECT reads (as fastsafetensors'
                      default), which bypass the page cache
  pinstage_device     pinstage.load_to_device(DIR, worker=w) on sim: through the pinned
                      ring into sim device memory (host RAM)

The Python API loads only into pinned memory (into= refuses pageable tensors), so there is
no pinstage row into pageable memory: on this CPU-only host the pinned row does more than
a pageable load (it also pre-faults and mlocks), and the peers cannot pin at all.

Every arm's bytes are hashed (xxh3-64 per tensor) after its timing and compared with one
reference digest of the files. GB/s = 10^9 bytes of tensor data per second. Output: a
table with each arm's ratio to the best peer, FILE.json (atomically, with a `run` block:
the CLI's plus every package version, the load average) and FILE.png beside it.
"""
import argparse
import ctypes
import gc
import importlib.metadata
import json
import math
import os
import pathlib
import resource
import struct
import subprocess
import sys
import tempfile
import time

from benchargs import add_dry_run, dry_run_done, write_json_atomically

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEERS = ["safetensors", "safetensors_pread", "fastsafetensors", "fastsafetensors_buffered",
         "runai", "torch_by_hand"]
OURS = ["pinstage", "pinstage_thp", "pinstage_pooled", "pinstage_direct", "pinstage_device"]
# safetensors' default gives views of the file's mapping (the page cache itself, faulted in
# as touched), not a copy in the process's memory: it is shown, but the ratios are to the
# best peer that copies the bytes into memory of its own, as every other arm does.
ZERO_COPY = {"safetensors"}
ARMS = PEERS + OURS
GIB = 1 << 30


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size, GiB (2..4 meant)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the best is reported")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of: " +
                    ", ".join(ARMS))
    ap.add_argument("--modes", default="warm,cold", help="warm, cold or both")
    ap.add_argument("--dir", help="where the checkpoint is (reused) or goes (kept)")
    ap.add_argument("--build", default=os.environ.get("PINSTAGE_BUILD_DIR", "build"))
    ap.add_argument("--json", help="write the report here (and the PNG beside it)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 0.25 GiB, 1 round (figures not meant to be kept)")
    add_dry_run(ap)
    a = ap.parse_args(argv)
    if a.quick:
        a.gib, a.rounds = 0.25, 1
    a.arms = [x.strip().lower() for x in a.arms.split(",") if x.strip()]
    a.modes = [x.strip().lower() for x in a.modes.split(",") if x.strip()]
    unknown = [x for x in a.arms if x not in ARMS]
    if unknown or not a.arms:
        ap.error(f"--arms: unknown {unknown} (known: {', '.join(ARMS)})")
    if not a.modes or any(m not in ("warm", "cold") for m in a.modes):
        ap.error("--modes: warm, cold or warm,cold")
    if a.rounds < 1 or not 0 < a.gib <= 64:
        ap.error("--rounds must be >= 1 and --gib in (0, 64]")
    if a.json is not None and (not a.json or not pathlib.Path(a.json).resolve().parent.is_dir()):
        ap.error(f"--json {a.json!r}: the folder must exist")
    return a


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


def run_arm(arm, ctx):
    d, files, pinstage = ctx["dir"], ctx["files"], ctx["pinstage"]
    return {
        "safetensors": lambda: arm_safetensors(files, ctx),
        "safetensors_pread": lambda: arm_safetensors(files, ctx, "pread"),
        "fastsafetensors": lambda: arm_fastsafetensors(files, ctx, True),
        "fastsafetensors_buffered": lambda: arm_fastsafetensors(files, ctx, False),
        "runai": lambda: arm_runai(files, ctx),
        "torch_by_hand": lambda: arm_by_hand(files, ctx),
        "pinstage": lambda: pinstage.load_file(d, worker=ctx["fresh"]),
        "pinstage_pooled": lambda: pinstage.load_file(d, worker=ctx["pooled"]),
        "pinstage_thp": lambda: with_env("PINSTAGE_HOST_HUGE_PAGES", "thp", lambda:
                                         pinstage.load_file(d, worker=ctx["fresh"])),
        "pinstage_direct": lambda: pinstage.load_file(d, worker=ctx["pooled"], direct=True),
        "pinstage_device": lambda: pinstage.load_to_device(d, worker=ctx["fresh"]),
    }[arm]()


def digest(got, arm, ctx):
    """{name: xxh3-64} of what an arm loaded."""
    x = ctx["pinstage"].xxh3_64
    if arm == "pinstage_device":
        return {n: x(got.to_bytes(n)) for n in got.keys()}
    torch = ctx["torch"]
    return {n: x(t.reshape(-1).view(torch.uint8).numpy()) for n, t in got.items()}


def pinned_state(got, arm, ctx):
    """Whether the arm's tensors are in pinned memory: pinstage's or torch's own."""
    if arm == "pinstage_device":
        return "device"
    t = next(iter(got.values()))
    return bool(ctx["pinstage"].is_pinned(t) or (ctx["torch"].cuda.is_available() and
                                                  t.is_pinned()))


# --- the report --------------------------------------------------------------------------

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


def picture(doc, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pinstage.plot import save_atomically
    arms = list(doc["best_gbps"])
    modes = doc["modes"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(modes)
    colors = {"warm": "#d62728", "cold": "#1f77b4"}
    for k, m in enumerate(modes):
        xs = [i + (k - (len(modes) - 1) / 2) * width for i in range(len(arms))]
        ys = [doc["best_gbps"][arm].get(m, 0.0) for arm in arms]
        ax.bar(xs, ys, width, label=f"{m} page cache", color=colors[m],
               edgecolor=["black" if arm in OURS else "none" for arm in arms])
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels(arms, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("GB/s (10^9 bytes/s), best of %d" % doc["rounds"])
    ax.set_title(f"{doc['bytes'] / 1e9:.2f} GB HF sharded checkpoint into host memory "
                 f"({doc['shards']} shards); pinstage outlined", fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    save_atomically(fig, out)


def main(argv=None):
    a = parse_args(argv)
    if dry_run_done(a):
        return 0
    into_the_venv()
    build = pathlib.Path(a.build).resolve()
    sys.path.insert(0, str(build / "python"))
    import huggingface_hub as hub
    import torch

    import pinstage

    dtypes = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
              "I32": torch.int32, "I64": torch.int64, "F16": torch.float16,
              "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
    load_start = os.getloadavg()
    print(f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"{os.cpu_count()} CPUs", flush=True)
    tmp = None
    if a.dir:
        d = pathlib.Path(a.dir).resolve()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="pinstage-peers-", dir="/var/tmp")
        d = pathlib.Path(tmp.name)
    try:
        if not (d / "model.safetensors.index.json").exists():
            t0 = time.perf_counter()
            write_checkpoint(d, a.gib, torch, hub)
            print(f"wrote the checkpoint in {time.perf_counter() - t0:.1f} s: {d}", flush=True)
        files = shards(d)
        nbytes = sum(e["data_offsets"][1] - e["data_offsets"][0]
                     for f in files for e in header(f)[1].values())
        file_bytes = sum(os.path.getsize(f) for f in files)
        warm(files)
        ref = reference_digest(files, pinstage)
        print(f"checkpoint: {nbytes / 1e9:.3f} GB of tensors, {len(ref)} tensors, "
              f"{len(files)} shards", flush=True)
        ctx = {"dir": d, "files": files, "pinstage": pinstage, "torch": torch,
               "dtypes": dtypes, "fresh": pinstage.Worker(host_cache_limit_bytes=0),
               "pooled": pinstage.Worker()}
        times = {arm: {m: [] for m in a.modes} for arm in a.arms}
        usage = {arm: {m: [] for m in a.modes} for arm in a.arms}  # per run: faults, CPU s
        residency = {m: [] for m in a.modes}
        pinned = {}
        for r in range(a.rounds):
            order = a.arms[r % len(a.arms):] + a.arms[:r % len(a.arms)]
            for mode in a.modes:
                for arm in order:
                    left = drop(files) if mode == "cold" else warm(files)
                    residency[mode].append(left)
                    gc.collect()
                    r0 = resource.getrusage(resource.RUSAGE_SELF)
                    t0 = time.perf_counter()
                    got = run_arm(arm, ctx)
                    seconds = time.perf_counter() - t0
                    r1 = resource.getrusage(resource.RUSAGE_SELF)
                    usage[arm][mode].append({
                        "minor_faults": r1.ru_minflt - r0.ru_minflt,
                        "major_faults": r1.ru_majflt - r0.ru_majflt,
                        "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                        "sys_s": r1.ru_stime - r0.ru_stime})
                    if digest(got, arm, ctx) != ref:
                        sys.exit(f"peers.py: {arm} ({mode}) loaded different bytes than the "
                                 "files hold")
                    pinned[arm] = pinned_state(got, arm, ctx)
                    if arm == "pinstage_device":
                        got.close()
                    del got
                    times[arm][mode].append(seconds)
                    u = usage[arm][mode][-1]
                    print(f"round {r + 1} {mode:4} {arm:24} {seconds:7.3f} s "
                          f"{nbytes / seconds / 1e9:6.2f} GB/s  CPU {u['cpu_s']:6.2f} s "
                          f"(sys {u['sys_s']:5.2f}), {u['minor_faults']:7d} minor faults  "
                          f"(resident before: {left:.1%})", file=sys.stderr, flush=True)
        gc.collect()
        ctx["fresh"].finalize()
        ctx["pooled"].finalize()
    finally:
        if tmp is not None:
            tmp.cleanup()
    load_end = os.getloadavg()
    best = {arm: {m: nbytes / min(v) / 1e9 for m, v in by.items()} for arm, by in times.items()}
    peers = [x for x in a.arms if x in PEERS and x not in ZERO_COPY]
    best_peer = {m: max(peers, key=lambda x: best[x][m]) for m in a.modes} if peers else {}
    print(f"\n{nbytes / 1e9:.2f} GB in {len(files)} shards, into host memory, best of "
          f"{a.rounds}; ratio = GB/s / the best copying peer's (warm: "
          f"{best_peer.get('warm', '-')}, cold: {best_peer.get('cold', '-')}); faults and CPU "
          "seconds of the best run")
    print(f"{'arm':26}" + "".join(f"{m + ' GB/s':>12}{'ratio':>8}{'faults':>9}{'CPU s':>7}"
                                  for m in a.modes) + "  pinned")
    for arm in a.arms:
        cells = ""
        for m in a.modes:
            ratio = best[arm][m] / best[best_peer[m]][m] if peers else float("nan")
            u = usage[arm][m][times[arm][m].index(min(times[arm][m]))]
            cells += f"{best[arm][m]:12.2f}{ratio:7.2f}x{u['minor_faults']:9d}{u['cpu_s']:7.2f}"
        note = "  (zero-copy views of the page cache)" if arm in ZERO_COPY else ""
        print(f"{arm:26}{cells}  {pinned[arm]}{note}")
    cold_left = max(residency["cold"]) if "cold" in residency else None
    warm_min = min(residency["warm"]) if "warm" in residency else None
    if cold_left is not None:
        print(f"cold arms: at most {cold_left:.2%} of the shards resident before an arm")
    if warm_min is not None:
        print(f"warm arms: at least {warm_min:.2%} resident before an arm")
    print(f"load average at the end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    if a.json:
        doc = {"run": run_block(a, build, {"load_average_start": load_start,
                                           "load_average_end": load_end}),
               "kind": "peers", "bytes": nbytes, "file_bytes": file_bytes,
               "shards": len(files), "tensors": len(ref), "rounds": a.rounds,
               "modes": a.modes, "seconds": times, "usage": usage, "best_gbps": best,
               "zero_copy_arms": sorted(ZERO_COPY & set(a.arms)),
               "best_peer": best_peer, "pinned": pinned,
               "residency_before_arm": residency,
               "ratio_to_best_peer": {arm: {m: best[arm][m] / best[best_peer[m]][m]
                                            for m in a.modes} for arm in a.arms}
               if peers else {}}
        write_json_atomically(a.json, doc)
        png = str(pathlib.Path(a.json).with_suffix(".png"))
        try:
            picture(doc, png)
            print(f"report: {a.json}, picture: {png}")
        except ImportError as e:
            print(f"report: {a.json} (no picture: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
