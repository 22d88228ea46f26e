#!/usr/bin/python3
"""The Qwen3 decode fixture: pinstage against the PyTorch reference, side by side.

    /usr/bin/python3 bench/fixture_vs_torch.py [--build build] [--layers 1 4] [--rounds 3]
                                               [--repeat 2]

For each layer count it alternates, --rounds times, one process of each side (so both
see the same machine state; on a VM, memory freed by one process is slow to touch for
the next until the host backs it again), each timing --repeat runs on fresh memory:
  torch      the reference: torch's normal_ on f32 for layer 0 of each random tensor,
             cast to bf16, torch.cat to stack the layers (plus the small tables), with
             torch using all cores;
  pinstage   `pinstage fixture qwen3-decode --layers N --first-touch --repeat R --json`:
             generation into fresh pageable memory and, in the same process, alternating
             with it, the first-touch floor (allocating the same storages and writing one
             byte per page on all cores) and the same storages populated with
             MADV_POPULATE_WRITE (the cheapest population, as the generator does it).
It prints the best run of each side, the speed-up over torch and the ratio to the
floor (targets: >= 8x, <= 1.5x), and every run on stderr.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import torch
from benchargs import add_dry_run, dry_run_done, write_json_atomically

ROOT = pathlib.Path(__file__).resolve().parents[1]

# name, dtype, rows per layer, cols, std, bias, stacked (the spec's table)
TABLE = [
    ("hidden_states", torch.bfloat16, 16, 5120, 1.0, 0.0, False),
    ("input_rms_weight", torch.float32, 1, 5120, 0.1, 1.0, True),
    ("wq", torch.bfloat16, 5120, 5120, 0.02, 0.0, True),
    ("wk", torch.bfloat16, 5120, 1024, 0.02, 0.0, True),
    ("wv", torch.bfloat16, 5120, 1024, 0.02, 0.0, True),
    ("q_norm_weight", torch.float32, 1, 128, 0.1, 1.0, True),
    ("k_norm_weight", torch.float32, 1, 128, 0.1, 1.0, True),
    ("k_cache", torch.bfloat16, 704512, 128, 0.01, 0.0, True),
    ("v_cache", torch.bfloat16, 704512, 128, 0.02, 0.3, True),
    ("wo", torch.bfloat16, 5120, 5120, 0.0006, 0.0, True),
    ("w_gate", torch.bfloat16, 5120, 17408, 0.02, 0.0, True),
    ("w_up", torch.bfloat16, 5120, 17408, 0.02, 0.0, True),
    ("w_down", torch.bfloat16, 17408, 5120, 0.0004, 0.0, True),
    ("post_rms_weight", torch.float32, 1, 5120, 0.1, 1.0, True),
]


def torch_fixture(layers, seq_len=3500, seed=1234):
    """The twenty arguments the PyTorch way."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, dtype, rows, cols, std, bias, stacked in TABLE:
        x = torch.empty(rows, cols, dtype=torch.float32).normal_(bias, std, generator=gen)
        x = x.to(dtype)
        out[name] = torch.cat([x] * layers) if stacked and layers > 1 else x
    pos = seq_len - 1
    out["seq_lens"] = torch.full((16,), seq_len, dtype=torch.int32)
    out["block_table"] = torch.arange(16 * 43, dtype=torch.int32)
    out["slot_mapping"] = torch.tensor(
        [(b * 43 + pos // 128) * 128 + pos % 128 for b in range(16)], dtype=torch.int32)
    inv = 10000.0 ** (-torch.arange(64, dtype=torch.float64) / 64)
    ang = torch.arange(5500, dtype=torch.float32)[:, None] * inv.float()[None, :]
    out["rope_cos"] = torch.cat([ang.cos(), ang.cos()], dim=1)
    out["rope_sin"] = torch.cat([ang.sin(), ang.sin()], dim=1)
    out["out"] = torch.zeros(16, 5120, dtype=torch.bfloat16)
    return out


def time_torch_here(layers, repeat):
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        args = torch_fixture(layers)
        runs.append(time.perf_counter() - t0)
        nbytes = sum(t.numel() * t.element_size() for t in args.values())
        del args
    return runs, nbytes


def time_torch(layers, repeat, threads):
    """The torch side in a process of its own."""
    cmd = [sys.executable, __file__, "--torch-side", "--layers", str(layers),
           "--repeat", str(repeat), "--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(done.stdout)
    return out["runs"], out["bytes"]


def time_pinstage(cli, layers, repeat, threads):
    cmd = [str(cli), "fixture", "qwen3-decode", "--layers", str(layers), "--first-touch",
           "--repeat", str(repeat), "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout), " ".join(cmd[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("PINSTAGE_BUILD_DIR", ROOT / "build"),
                    help="CMake build folder holding bin/pinstage")
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=3, help="alternating processes per side")
    ap.add_argument("--repeat", type=int, default=2, help="runs per process")
    ap.add_argument("--threads", type=int, default=0, help="threads for both (0 = all cores)")
    ap.add_argument("--json", help="also write every timing here")
    ap.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    add_dry_run(ap)
    a = ap.parse_args()
    if dry_run_done(a):
        return 0
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    if a.torch_side:
        runs, nbytes = time_torch_here(a.layers[0], a.repeat)
        print(json.dumps({"runs": runs, "bytes": nbytes}))
        return
    cli = pathlib.Path(a.build) / "bin" / "pinstage"
    if not cli.exists():
        sys.exit(f"{cli} not found: build the project first (or pass --build)")

    rows, record = [], {"threads": threads, "torch": torch.__version__, "runs": []}
    for layers in a.layers:
        torch_runs, ours_runs, floor_runs, pop_runs = [], [], [], []
        for _ in range(a.rounds):
            runs, nbytes = time_torch(layers, a.repeat, threads)
            torch_runs += runs
            ours, cmd = time_pinstage(cli, layers, a.repeat, a.threads)
            assert ours["total_bytes"] == nbytes, (ours["total_bytes"], nbytes)
            ours_runs += ours["generate_s"]
            floor_runs += ours["first_touch_s"]
            pop_runs += ours["populate_s"]
        t_torch, t_ours, t_floor, t_pop = min(torch_runs), min(ours_runs), min(floor_runs), min(pop_runs)
        rows.append((layers, nbytes, t_torch, t_ours, t_floor, t_pop))
        record["runs"].append({"layers": layers, "bytes": nbytes, "torch_s": torch_runs,
                               "pinstage_s": ours_runs, "first_touch_s": floor_runs,
                               "populate_s": pop_runs, "generator": ours["generator"],
                               "command": cmd})
        print(f"layers {layers}: torch {[round(x, 3) for x in torch_runs]} s; "
              f"pinstage {[round(x, 3) for x in ours_runs]} s; "
              f"first touch {[round(x, 3) for x in floor_runs]} s; "
              f"populate {[round(x, 3) for x in pop_runs]} s", file=sys.stderr)

    print(f"threads {threads}, torch {torch.__version__}, generator {ours['generator']}, "
          f"best of {a.rounds} x {a.repeat} runs per side")
    print(f"{'layers':>6} {'bytes':>15} {'torch s':>9} {'pinstage s':>11} {'speed-up':>9} "
          f"{'first-touch s':>14} {'vs floor':>9} {'populate s':>11} {'vs populate':>12}")
    for layers, nbytes, t_torch, t_ours, t_floor, t_pop in rows:
        print(f"{layers:>6} {nbytes:>15,} {t_torch:>9.3f} {t_ours:>11.3f} {t_torch / t_ours:>8.1f}x "
              f"{t_floor:>14.3f} {t_ours / t_floor:>8.2f}x {t_pop:>11.3f} {t_ours / t_pop:>11.2f}x")
    if a.json:
        write_json_atomically(a.json, record)


if __name__ == "__main__":
    main()
