#!/usr/bin/python3
"""The C++ golden against the project's PyTorch reference of the same decode, side by side.

    /usr/bin/python3 bench/golden_vs_torch.py [--build-dir build] [--layers 1]
        [--seq-len 3500] [--rounds 3] [--cpp-runs 3]

Writes a fixture with <build>/bin/qwen3_dump, then alternates rounds: the PyTorch reference
(tests/python/qwen3_torch_reference.py, all cores) on the exported fixture, and qwen3_dump
timing the C++ golden (best of --cpp-runs, fixture generation not timed). Checks that both
agree within the scene's tolerance, prints each round and the speed-up of the best times
per layer. Both use every core. Needs (layers * 1.03 GB) * 2 of memory plus PyTorch's f32
copies of one layer's weights.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import qwen3_torch_reference as ref  # noqa: E402
from benchargs import add_build_and_rounds, add_dry_run, dry_run_done  # noqa: E402 (bench/ is sys.path[0])


def cpp_golden(tool, layers, seq_len, runs, out_dir=None):
    cmd = [str(tool), "--layers", str(layers), "--seq-lens", str(seq_len), "--runs", str(runs)]
    if out_dir is not None:
        cmd += ["--out-dir", str(out_dir)]
    result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_and_rounds(parser, "--build-dir", ROOT / "build")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=3500)
    parser.add_argument("--cpp-runs", type=int, default=3)
    add_dry_run(parser)
    opts = parser.parse_args()
    if dry_run_done(opts):
        return 0

    tool = pathlib.Path(opts.build_dir) / "bin" / "qwen3_dump"
    if not tool.exists():
        sys.exit(f"{tool} not found: build the target qwen3_dump first")
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)

    with tempfile.TemporaryDirectory(prefix="golden_vs_torch_") as tmp:
        first = cpp_golden(tool, opts.layers, opts.seq_len, 1, tmp)
        args = ref.read_safetensors(pathlib.Path(tmp) / "fixture.safetensors")
        golden = ref.read_safetensors(pathlib.Path(tmp) / f"golden_{opts.seq_len}.safetensors")
        args["seq_lens"] = golden["seq_lens"]
        args["slot_mapping"] = golden["slot_mapping"]

        print(f"layers {opts.layers}, seq_len {opts.seq_len}, {threads} threads, "
              f"C++ kernels {first['isa']}, torch {torch.__version__}")
        print(f"{'round':>5} {'torch s/layer':>14} {'C++ s/layer':>12} {'ratio':>7}")
        torch_best = cpp_best = float("inf")
        for r in range(opts.rounds):
            t0 = time.perf_counter()
            out, rows, k_rows, v_rows = ref.decode(args, opts.layers)
            torch_s = (time.perf_counter() - t0) / opts.layers
            cpp_s = min(cpp_golden(tool, opts.layers, opts.seq_len, opts.cpp_runs)["seconds"])
            cpp_s /= opts.layers
            torch_best = min(torch_best, torch_s)
            cpp_best = min(cpp_best, cpp_s)
            print(f"{r:>5} {torch_s:>14.3f} {cpp_s:>12.4f} {torch_s / cpp_s:>6.1f}x")

        bad = {name: int(ref.mismatches(golden[key], value).sum())
               for name, key, value in (("out", "out", out), ("k_rows", "k_rows", k_rows),
                                        ("v_rows", "v_rows", v_rows))}
        same_rows = torch.equal(golden["kv_rows"], rows)
        print(f"best: torch {torch_best:.3f} s/layer, C++ {cpp_best:.4f} s/layer, "
              f"speed-up {torch_best / cpp_best:.1f}x")
        print(f"agreement: rows {'same' if same_rows else 'DIFFER'}, mismatches {bad}")
        if not same_rows or any(bad.values()):
            sys.exit(1)


if __name__ == "__main__":
    main()
