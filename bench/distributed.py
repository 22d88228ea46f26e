#!/usr/bin/python3
"""pinstage.distributed under torchrun: per-rank and aggregate GB/s for 1, 2 and 4 ranks on
this machine, "own-slices" against "once-per-node", side by side in one run.

    /usr/bin/python3 bench/distributed.py [--mib 512] [--files 8] [--ranks 1,2,4]
                                          [--rounds 3] [--build build] [--json FILE]

It writes a checkpoint of --mib MiB in --files shards (float16 matrices, half split by
rows, half by columns: contiguous and strided slices), reads it once to warm the page
cache, then for each rank count runs one torchrun job (Gloo, sim) whose ranks load their
tensor-parallel share --rounds times in each mode, the modes alternating. Per job and mode
it prints the median over rounds of: a rank's GB/s (its slice bytes over its load time,
median of ranks), the aggregate GB/s (every rank's bytes over the slowest rank's time)
and the bytes the job read from the files. A load includes the staging onto the sim
device. GB/s = 10^9 bytes/s.
"""
import argparse
import json
import os
import pathlib
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from benchargs import add_dry_run, dry_run_done, write_json_atomically

HERE = pathlib.Path(__file__).resolve()
LAUNCH = ["--standalone", "--redirects", "2", "--tee", "2", "--monitor_interval", "0.1"]
MODES = ("own-slices", "once-per-node")


def write_checkpoint(directory, mib, files):
    """--mib MiB of float16 in `files` shards (4 tensors each) and a plan; returns paths."""
    d = directory / "model"
    d.mkdir()
    per = (mib << 20) // (files * 4)
    cols = 1024
    rows = max(8, per // (cols * 2))
    weight_map = {}
    for f in range(files):
        shard = f"model-{f + 1:05d}-of-{files:05d}.safetensors"
        header, offset = {}, 0
        for t in range(4):
            name = f"layers.{f}.{'row' if t % 2 == 0 else 'col'}_{t}.weight"
            n = rows * cols * 2
            header[name] = {"dtype": "F16", "shape": [rows, cols],
                            "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = shard
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(d / shard, "wb") as out:
            out.write(struct.pack("<Q", len(text)) + text)
            out.write(os.urandom(offset))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    plan = directory / "plan.json"
    plan.write_text(json.dumps({"format": "pinstage.tp_plan/1",
                                "rules": [{"match": "*.row_*", "split": 0},
                                          {"match": "*.col_*", "split": 1}]}))
    return d, plan


def rank_main(model, plan, rounds, out):
    """One rank of a job: rounds of both modes; rank 0 writes every rank's reports."""
    import torch.distributed as dist
    from pinstage import distributed as pd

    dist.init_process_group("gloo")
    pd.setup(backend="sim")
    results = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            dist.barrier()
            load = pd.load_sharded(model, plan, read=mode)
            results[mode].append(pd.gather_reports(load))
            load.tensors.clear()
            load.close()
    if dist.get_rank() == 0:
        pathlib.Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def summarize(reports_by_round):
    """Median over rounds of (per-rank GB/s median, aggregate GB/s, bytes read)."""
    per, agg, read = [], [], []
    for reports in reports_by_round:
        per.append(statistics.median(r["host_bytes"] / r["total_s"] / 1e9 for r in reports))
        agg.append(sum(r["host_bytes"] for r in reports) /
                   max(r["total_s"] for r in reports) / 1e9)
        read.append(sum(r["read_bytes"] for r in reports))
    return statistics.median(per), statistics.median(agg), statistics.median(read)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build", default=os.environ.get("PINSTAGE_BUILD_DIR", "build"))
    ap.add_argument("--json", help="write every rank's reports of every job here")
    add_dry_run(ap)
    ap.add_argument("--rank", nargs=4, metavar=("MODEL", "PLAN", "ROUNDS", "OUT"),
                    help=argparse.SUPPRESS)  # internal: one rank of a torchrun job
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    if a.rank:
        sys.path.insert(0, str(build / "python"))
        return rank_main(a.rank[0], a.rank[1], int(a.rank[2]), a.rank[3])
    ranks = [int(r) for r in a.ranks.split(",")]
    if a.mib < 1 or a.files < 1 or a.rounds < 1 or any(r < 1 for r in ranks):
        ap.error("--mib, --files, --rounds and every --ranks entry must be >= 1")
    if dry_run_done(a):
        return 0
    env = {k: v for k, v in os.environ.items() if k != "PINSTAGE_NUM_THREADS"}
    env["PYTHONPATH"] = str(build / "python")
    everything = {}
    with tempfile.TemporaryDirectory(prefix="pinstage-bench-dist-") as tmp:
        model, plan = write_checkpoint(pathlib.Path(tmp), a.mib, a.files)
        for f in model.glob("*.safetensors"):  # warm the page cache
            f.read_bytes()
        print(f"{a.mib} MiB in {a.files} files, {a.rounds} rounds per mode, load "
              f"{os.getloadavg()[0]:.2f} at start", flush=True)
        print(f"{'ranks':>5}  {'mode':14} {'per-rank GB/s':>13} {'aggregate GB/s':>14} "
              f"{'read GB':>8}")
        for n in ranks:
            out = pathlib.Path(tmp) / f"job{n}.json"
            t0 = time.perf_counter()
            done = subprocess.run(
                ["/usr/bin/torchrun", *LAUNCH, f"--nproc_per_node={n}", str(HERE),
                 "--build", str(build), "--rank", str(model), str(plan), str(a.rounds),
                 str(out)], capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode != 0:
                sys.exit(f"the {n}-rank job failed:\n{done.stderr[-4000:]}")
            results = json.loads(out.read_text())
            everything[n] = results
            for mode in MODES:
                per, agg, read = summarize(results[mode])
                print(f"{n:>5}  {mode:14} {per:13.2f} {agg:14.2f} {read / 1e9:8.3f}")
            print(f"       (job {time.perf_counter() - t0:.1f} s with torchrun's start)",
                  flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if a.json:
        write_json_atomically(a.json, everything)
    return 0


if __name__ == "__main__":
    sys.exit(main())
