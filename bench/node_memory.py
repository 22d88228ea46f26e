#!/usr/bin/python3
"""Memory on one node: N torchrun ranks load the same checkpoint, and the memory they add
to the machine is read from /proc/meminfo, one arm after another in one run.

    python bench/node_memory.py [--mib 2048] [--files 4] [--ranks 4] [--rounds 3]
        [--arms map,copy,safetensors-clone,map-slices,vllm-map,vllm-copy]
        [--build build] [--json FILE]

Run it with an interpreter that has torch (torch.distributed), safetensors and, for the
vllm-* arms, vLLM: the engines venv (`scripts/venv.sh requirements/engines.txt`) has all.
The arms, each rank doing the same:
  map                pinstage.load_file(mode="map"): read-only views of the page cache,
                     pinned in place (every rank maps the same files)
  copy               pinstage.load_file(): writable pinned copies, private to each rank
  safetensors-clone  safetensors' safe_open(...).get_tensor(name).clone(), tensor by tensor
  map-slices         safe_open(mode="map").get_slice(name)[part]: each rank's rows only
  vllm-map/-copy     vLLM's --load-format pinstage loader (pinstage.vllm), its
                     load_weights feeding a model that keeps every tensor it is given (what
                     the loader costs the host when nothing is dropped)
Every rank imports everything first. Before each job the checkpoint's pages are dropped
from the page cache (posix_fadvise DONTNEED), so every job starts cold. Rank 0 reads
/proc/meminfo once all ranks are ready (before), every 10 ms while they load (the peak)
and once all hold their tensors (after). The columns, as ratios to the checkpoint's bytes:
  added        MemTotal - MemFree, after minus before: everything the job brought into
               memory, the page cache it filled counted once however many ranks map it
  peak         the same at its highest during the load
  ranks' PSS   the ranks' proportional set sizes summed, after minus before: what they
               hold mapped or allocated, a page shared by k ranks counted 1/k in each (so
               once in the sum); immune to other processes on the machine
  unavailable  MemTotal - MemAvailable, after minus before: reclaimable page cache not
               counted (pinned page cache counts where the kernel moves it to the
               unevictable list, which it does not for large folios mapped by PTEs)
GB = 10^9 bytes; each figure is the median over --rounds jobs.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchargs import add_dry_run, dry_run_done, write_json_atomically
from distributed import write_checkpoint

HERE = pathlib.Path(__file__).resolve()
LAUNCH = ["--standalone", "--redirects", "2", "--tee", "2", "--monitor_interval", "0.1"]
ARMS = ("map", "copy", "safetensors-clone", "map-slices", "vllm-map", "vllm-copy")
NEEDS = {"safetensors-clone": "safetensors", "vllm-map": "vllm", "vllm-copy": "vllm"}
FIELDS = ("MemTotal", "MemFree", "MemAvailable", "Unevictable", "Mlocked", "AnonPages", "Cached")


def meminfo():
    """The FIELDS of /proc/meminfo, in bytes."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in FIELDS:
                out[key] = int(value.split()[0]) * 1024
    out["used"] = out["MemTotal"] - out["MemAvailable"]
    out["used_with_cache"] = out["MemTotal"] - out["MemFree"]
    return out


class Holder:
    """A model as vLLM's loader sees one, keeping every (name, tensor) it is given."""

    def __init__(self):
        self.kept = []

    def named_parameters(self):
        return iter(())

    def named_modules(self):
        return iter(())

    def load_weights(self, weights):
        self.kept.extend(weights)
        return {name for name, _ in self.kept}


def load(arm, model, rank, world):
    """What one rank of `arm` loads and holds (returned, so it stays alive)."""
    import pinstage
    if arm in ("map", "copy"):
        return pinstage.load_file(model, worker=pinstage.Worker(), mode=arm)
    if arm == "safetensors-clone":
        from safetensors import safe_open
        held = {}
        for shard in sorted(pathlib.Path(model).glob("*.safetensors")):
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():
                    held[name] = f.get_tensor(name).clone()
        return held
    if arm == "map-slices":
        held = {}
        with pinstage.safe_open(model, worker=pinstage.Worker(), mode="map") as f:
            for name in f.keys():
                rows = f.get_slice(name).get_shape()[0]
                begin, count = pinstage.tp_part(rows, world, rank)
                held[name] = f.get_slice(name)[begin:begin + count]
        return held
    import types
    import pinstage.vllm
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    pinstage.vllm.register()
    loader = get_model_loader(LoadConfig(load_format="pinstage", model_loader_extra_config={
        "mode": arm.split("-")[1], "progress": False}))
    holder = Holder()
    loader.load_weights(holder, types.SimpleNamespace(model=model, revision=None,
                                                      quantization=None))
    return holder


def pss():
    """This process's proportional set size in bytes: a page shared by k processes counts
    1/k in each, so the ranks' sum counts the shared page cache once."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss in /proc/self/smaps_rollup")


def rank_main(arm, model, out):
    """One rank: import, wait for all, load and hold, wait for all; rank 0 measures."""
    import torch.distributed as dist

    import pinstage  # noqa: F401 (everything imported before "before")
    if arm in NEEDS:
        __import__("vllm.model_executor.model_loader" if arm.startswith("vllm") else
                   "safetensors.torch")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pss_before = pss()
    dist.barrier()
    before, peak, stop = meminfo(), [0], threading.Event()

    def sample():
        while not stop.wait(0.01):
            peak[0] = max(peak[0], meminfo()["used_with_cache"])

    sampler = threading.Thread(target=sample, daemon=True)
    if rank == 0:
        sampler.start()
    t0 = time.perf_counter()
    held = load(arm, model, rank, world)
    seconds = [None] * world
    dist.all_gather_object(seconds, time.perf_counter() - t0)  # every rank holds its load
    after = meminfo()
    grown = [None] * world
    dist.all_gather_object(grown, pss() - pss_before)
    if rank == 0:
        stop.set()
        sampler.join()
        pathlib.Path(out).write_text(json.dumps({
            "before": before, "after": after,
            "peak_with_cache": max(peak[0], after["used_with_cache"]),
            "pss_added": sum(grown), "load_s": max(seconds)}))
    dist.barrier()
    del held
    dist.destroy_process_group()


def evict(model):
    """Drops the checkpoint's pages from the page cache (clean, unmapped pages go), so each
    job starts cold and the cache it fills is counted; returns the bytes still resident
    (util-linux's fincore; None without it)."""
    files = sorted(pathlib.Path(model).glob("*.safetensors"))
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages (a checkpoint just written) are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                              *map(str, files)], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(int(x) for x in out.stdout.split())


def run_arm(arm, model, ranks, build, tmp):
    """One torchrun job of `ranks` ranks; its measurement."""
    out = pathlib.Path(tmp) / f"{arm}.json"
    env = {k: v for k, v in os.environ.items() if k != "PINSTAGE_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(build / "python"), str(HERE.parent)])
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *LAUNCH, f"--nproc_per_node={ranks}",
         str(HERE), "--build", str(build), "--rank", arm, str(model), str(out)],
        capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"the {arm} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def figures(result):
    """What the job added (bytes): the machine's memory page cache included, the ranks'
    summed PSS, the reclaimable-excluded figure and the fields that explain them."""
    b, a = result["before"], result["after"]
    return {"added": a["used_with_cache"] - b["used_with_cache"],
            "peak": result["peak_with_cache"] - b["used_with_cache"],
            "pss": result["pss_added"], "unavailable": a["used"] - b["used"],
            "cached": a["Cached"] - b["Cached"], "anon": a["AnonPages"] - b["AnonPages"],
            "load_s": result["load_s"]}


def report(arm, rounds, size, ranks):
    """One table row: medians over rounds (the range of the main figure beside it)."""
    med = {k: statistics.median(f[k] for f in rounds) for k in rounds[0]
           if k != "resident_before"}
    spread = [f["added"] / size for f in rounds]
    x = {k: med[k] / size for k in ("added", "peak", "pss", "unavailable")}
    print(f"| {arm} | {ranks} | {med['added'] / 1e9:.2f} | **{x['added']:.2f}x** "
          f"({min(spread):.2f}-{max(spread):.2f}) | {x['peak']:.2f}x | {x['pss']:.2f}x | "
          f"{x['unavailable']:.2f}x | {med['cached'] / 1e9:.2f} | {med['anon'] / 1e9:.2f} | "
          f"{med['load_s']:.2f} |", flush=True)
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--build", default=os.environ.get("PINSTAGE_BUILD_DIR", "build"))
    ap.add_argument("--json", help="write every round's figures here")
    add_dry_run(ap)
    ap.add_argument("--rank", nargs=3, metavar=("ARM", "MODEL", "OUT"),
                    help=argparse.SUPPRESS)  # internal: one rank of a torchrun job
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    if a.rank:
        sys.path.insert(0, str(build / "python"))
        return rank_main(*a.rank)
    arms = a.arms.split(",")
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown arm {unknown[0]!r} (the arms: {', '.join(ARMS)})")
    if min(a.mib, a.files, a.ranks, a.rounds) < 1:
        ap.error("--mib, --files, --ranks and --rounds must be >= 1")
    import importlib.util
    for arm in arms:
        if arm in NEEDS and importlib.util.find_spec(NEEDS[arm]) is None:
            ap.error(f"the {arm} arm needs {NEEDS[arm]}, which {sys.executable} lacks: run "
                     "with the engines venv's python (scripts/venv.sh requirements/engines.txt)"
                     " or leave the arm out of --arms")
    if dry_run_done(a):
        return 0
    return measure(a, arms, build)


def measure(a, arms, build):
    """Writes the checkpoint, runs --rounds jobs of each arm, prints the table."""
    everything = {}
    with tempfile.TemporaryDirectory(prefix="pinstage-bench-mem-") as tmp:
        model, _ = write_checkpoint(pathlib.Path(tmp), a.mib, a.files)
        size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        print(f"{size / 1e9:.2f} GB in {a.files} files, {a.ranks} ranks, {a.rounds} rounds "
              f"(median, range); load average {os.getloadavg()[0]:.2f} at start", flush=True)
        print("| arm | ranks | added GB | added / checkpoint | peak | ranks' PSS | "
              "unavailable | Cached GB | AnonPages GB | load s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for arm in arms:
            rounds = []
            for _ in range(a.rounds):
                resident = evict(model)
                if resident:
                    print(f"({arm}: {resident / 1e9:.2f} GB of the checkpoint stayed in the "
                          "page cache after the eviction)", flush=True)
                rounds.append(dict(figures(run_arm(arm, model, a.ranks, build, tmp)),
                                   resident_before=resident))
            everything[arm] = {"rounds": rounds, "median": report(arm, rounds, size, a.ranks)}
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if a.json:
        write_json_atomically(a.json, {"checkpoint_bytes": size, "ranks": a.ranks,
                                       "arms": everything})
    return 0


if __name__ == "__main__":
    sys.exit(main())
