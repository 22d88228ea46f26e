#!/usr/bin/python3
"""Loading a checkpoint from Python: pinstage.load_file against what torch users do by hand.

    /usr/bin/python3 bench/load_vs_torch.py PATH [--build build] [--rounds 3] [--threads 0]

PATH is a .safetensors file or a directory of shards (e.g. from `pinstage fixture
qwen3-decode --out DIR --shard-size 512M`). Each round runs, in this order, with the page
cache warm (every file was read once before the first round):
  torch_frombuffer  the hand-written path: f.read() of each whole file into pageable
                    memory, the header parsed by hand, torch.frombuffer(...).view(dtype)
                    per tensor, then .pin_memory() (a copy into pinned memory, which
                    Debian's CPU-only torch refuses: then the copy goes into tensors of a
                    pinstage PinnedTorchAllocator, which is what pin_memory would give);
  pinstage          pinstage.load_file(PATH, worker=w): parallel pread straight into
                    pinned buffers, zero-copy torch views.
It prints the best time and GB/s of each side and the speed-up (target: >= 3x, the
warm-cache target of docs/loading.md for path (a)).
"""
import argparse
import gc
import json
import os
import pathlib
import struct
import sys
import time
from benchargs import add_build_and_rounds, add_dry_run, dry_run_done


def shard_files(path):
    p = pathlib.Path(path)
    if p.is_file():
        return [p]
    index = p / "model.safetensors.index.json"
    if index.exists():
        return sorted({p / s for s in json.loads(index.read_text())["weight_map"].values()})
    return sorted(p.glob("*.safetensors"))


def by_hand(files, torch, dtypes, pinned):
    """f.read(), a hand parse, torch.frombuffer per tensor, then a copy into pinned memory."""
    out = {}
    for f in files:
        raw = bytearray(open(f, "rb").read())
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        base = 8 + n
        for name, e in header.items():
            b, end = e["data_offsets"]
            if end == b:
                t = torch.zeros(e["shape"], dtype=dtypes[e["dtype"]])
            else:
                t = torch.frombuffer(raw, dtype=torch.uint8, count=end - b, offset=base + b)
                t = t.view(dtypes[e["dtype"]]).view(e["shape"])
            out[name] = pinned(t)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    add_build_and_rounds(ap, "--build", "build")
    ap.add_argument("--threads", type=int, default=0)
    add_dry_run(ap)
    a = ap.parse_args()
    if dry_run_done(a):
        return 0
    sys.path.insert(0, str(pathlib.Path(a.build).resolve() / "python"))
    import torch
    import pinstage

    dtypes = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
              "I32": torch.int32, "I64": torch.int64, "F16": torch.float16,
              "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
    for name, attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
        if hasattr(torch, attr):  # torch >= 2.1 (Debian's 1.13 has no float8)
            dtypes[name] = getattr(torch, attr)
    files = shard_files(a.path)
    total = sum(os.path.getsize(f) for f in files)
    w = pinstage.Worker()
    alloc = pinstage.PinnedTorchAllocator(w)

    def pinned(t):
        try:
            return t.pin_memory()
        except RuntimeError:  # CPU-only torch: no pinned allocator of its own
            return alloc.copy(t)

    for f in files:  # warm the page cache
        open(f, "rb").read()
    times = {"torch_frombuffer": [], "pinstage": []}
    for r in range(a.rounds):
        for side in times:
            gc.collect()
            t0 = time.perf_counter()
            if side == "pinstage":
                got = pinstage.load_file(a.path, worker=w, threads=a.threads)
            else:
                got = by_hand(files, torch, dtypes, pinned)
            times[side].append(time.perf_counter() - t0)
            del got
            print(f"round {r + 1} {side}: {times[side][-1]:.3f} s", file=sys.stderr)
    gc.collect()
    best = {k: min(v) for k, v in times.items()}
    for k, s in best.items():
        print(f"{k:18s} best {s:8.3f} s  {total / s / 1e9:7.2f} GB/s  ({total} bytes)")
    print(f"speed-up of pinstage over torch_frombuffer: "
          f"{best['torch_frombuffer'] / best['pinstage']:.2f}x")
    w.finalize()


if __name__ == "__main__":
    main()
