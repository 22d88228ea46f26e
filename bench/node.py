#!/usr/bin/python3
"""The node level on sim, side by side in one run: a group bind on 1 device against 2
devices at once (aggregate upload GB/s), with sim's link unpaced (host memcpy speed) and
paced at --link-gbps per device; and a tensor-parallel load of one checkpoint onto 1
device (tp 1) against 2 devices (tp 2).

    /usr/bin/python3 bench/node.py [--bind-mib 512] [--load-mib 2048] [--rounds 5]
                                   [--link-gbps 4] [--build build] [--json FILE]

Arms alternate within each round, and the best round of each is reported (the figures
are ratios on a shared machine: the best is the least disturbed). The host copy limit is
the same copy a device upload does on sim, measured alone: one thread (what one device's
upload uses) and every thread. GB/s = 10^9 bytes/s.
"""
import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from distributed import write_checkpoint  # noqa: E402 (the same checkpoint and plan)
from benchargs import add_dry_run, dry_run_done, write_json_atomically  # noqa: E402 (bench/ is on sys.path)


def group(pinstage, devices, link_gbps):
    config = {"devices": str(devices)}
    if link_gbps:
        config["link_gbps"] = str(link_gbps)
    return pinstage.WorkerGroup("sim", "all", config=config)


def bind_args(pinstage, torch, g, mib):
    args = []
    for w in g:
        alloc = pinstage.PinnedTorchAllocator(w)
        a = pinstage.TaskArgs()
        a.add("w", alloc.zeros(((mib << 20) // 2,), torch.bfloat16))
        args.append(a)
    return args


def bind_arms(pinstage, torch, mib, rounds, link_gbps):
    """{(link, devices): best aggregate upload GB/s}, arms alternating each round."""
    groups = {(link, n): group(pinstage, n, link) for link in (0, link_gbps) for n in (1, 2)}
    args = {k: bind_args(pinstage, torch, g, mib) for k, g in groups.items()}
    best = {k: 0.0 for k in groups}
    for _ in range(rounds):
        for k, g in groups.items():
            best[k] = max(best[k], g.bind(args[k]).upload_gbps)
    del args
    for g in groups.values():
        g.finalize()
    return best


def host_copy_limit(mib, rounds):
    """The copy a sim upload does (host RAM to host RAM), alone: one thread, and every
    usable CPU copying a part each (NumPy's copy lets the GIL go)."""
    import threading

    import numpy as np
    src = np.ones(mib << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    out = {}
    for threads in sorted({1, len(os.sched_getaffinity(0))}):
        parts = np.array_split(np.arange(src.size), threads)
        best = 0.0
        for _ in range(rounds):
            workers = [threading.Thread(target=np.copyto, args=(dst[p[0]:p[-1] + 1],
                                                                  src[p[0]:p[-1] + 1]))
                       for p in parts]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = max(best, src.size / (time.perf_counter() - t0) / 1e9)
        out[threads] = best
    return out


def load_arms(pinstage, model, plan, rounds):
    """{tp: best (total_s, read GB, upload GB/s)} of load_to_devices, tp 1 and 2 alternating."""
    groups = {tp: group(pinstage, tp, 0) for tp in (1, 2)}
    best = {}
    for _ in range(rounds):
        for tp, g in groups.items():
            load = pinstage.load_to_devices(model, g, plan)
            r = load.report
            row = (r["total_s"], r["read_bytes"] / 1e9, r["upload_gbps"])
            load.close()
            if tp not in best or row[0] < best[tp][0]:
                best[tp] = row
    for g in groups.values():
        g.finalize()
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bind-mib", type=int, default=512, help="each device's input, MiB")
    ap.add_argument("--load-mib", type=int, default=2048, help="the checkpoint, MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--link-gbps", type=int, default=4, help="sim's paced link per device")
    ap.add_argument("--build", default=os.environ.get("PINSTAGE_BUILD_DIR", "build"))
    ap.add_argument("--json", help="write the figures here")
    add_dry_run(ap)
    a = ap.parse_args()
    if min(a.bind_mib, a.load_mib, a.rounds, a.link_gbps) < 1:
        ap.error("--bind-mib, --load-mib, --rounds and --link-gbps must be >= 1")
    if dry_run_done(a):
        return 0
    sys.path.insert(0, str(pathlib.Path(a.build).resolve() / "python"))
    import torch
    import pinstage

    print(f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    limit = host_copy_limit(a.bind_mib, a.rounds)
    binds = bind_arms(pinstage, torch, a.bind_mib, a.rounds, a.link_gbps)
    print(f"group bind, {a.bind_mib} MiB per device, best of {a.rounds}:")
    for link in (0, a.link_gbps):
        one, two = binds[(link, 1)], binds[(link, 2)]
        name = "unpaced" if link == 0 else f"link {link} GB/s"
        print(f"  {name:16} 1 device {one:7.2f} GB/s   2 devices {two:7.2f} GB/s aggregate"
              f"   ratio {two / one:5.2f}x")
    print("  host copy alone: " +
          ", ".join(f"{t} thread(s) {g:.2f} GB/s" for t, g in limit.items()))
    with tempfile.TemporaryDirectory(prefix="pinstage-bench-node-") as tmp:
        model, plan = write_checkpoint(pathlib.Path(tmp), a.load_mib, 8)
        for f in model.glob("*.safetensors"):  # warm the page cache
            f.read_bytes()
        loads = load_arms(pinstage, model, plan, a.rounds)
    print(f"tensor-parallel load, {a.load_mib} MiB (warm), best of {a.rounds}:")
    for tp, (total, read, up) in loads.items():
        print(f"  tp {tp}: {total:6.3f} s, read {read:.3f} GB (once), upload {up:6.2f} GB/s "
              "aggregate")
    print(f"  tp 2 / tp 1 time: {loads[2][0] / loads[1][0]:.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if a.json:
        write_json_atomically(a.json, {"bind": {f"{k[0]}:{k[1]}": v for k, v in binds.items()},
                                       "host_copy": limit, "load": loads})
    return 0


if __name__ == "__main__":
    sys.exit(main())
