#!/usr/bin/env python3
"""The course's GPT and lab 04's DDP against the same model in PyTorch, side by side.

Run by `./lab bench peers` (which builds the C++ side and finds a Python with torch). Three
workloads, each timed on both sides with the same shapes, AdamW and thread rule:

  gpt      one process: lab 04's demo model (vocab 128, seq 64, 4 blocks, 4 heads, width 192,
           tied head: 1.82 M parameters), batch 64; the C++ side is lab 04's demo on 1 rank
  ddp      2 ranks, the same model, global batch 128: lab 04's DDP over MPI vs PyTorch's
           DistributedDataParallel over gloo (1 MiB buckets on both)
  ddp-small  2 ranks, 2 blocks of width 128, seq 32 (417 k parameters), global batch 16

Each round runs the C++ side, then the PyTorch side (A B A B ...: a machine whose speed drifts
moves both alike). Each run reports the median step over its steps after a warm-up step (for
2 ranks, the slowest rank's); the table shows the median over rounds of each side and of the
per-round ratio C++ / PyTorch (below 1: the course's code is faster).
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# name, ranks, shape flags (both sides understand them), global batch, steps per run, what
WORKLOADS = [
    ("gpt", 1, [], 64, 12, "GPT step, 1 process, 1.82 M params, batch 64 x 64"),
    ("ddp", 2, [], 128, 12, "DDP step, 2 ranks, 1.82 M params, batch 128 x 64"),
    ("ddp-small", 2, ["--seq", "32", "--d-model", "128", "--layers", "2"], 16, 30,
     "DDP step, 2 ranks, 417 k params, batch 16 x 32"),
]


def run(cmd, pattern):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(pattern, out.stdout, re.M)
    if out.returncode != 0 or not m:
        sys.exit(f"peers: {shlex.join(cmd)} failed (exit {out.returncode}):\n{out.stdout[-2000:]}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpp", required=True, help="lab 04's demo binary (lab04_run_*)")
    p.add_argument("--mpirun", default="mpirun", help="mpirun and its flags")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="", help="comma-separated workloads (gpt,ddp,ddp-small)")
    args = p.parse_args()
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, ranks, shape, batch, steps, what in WORKLOADS:
        if only and name not in only:
            continue
        common = shape + ["--batch", str(batch), "--steps", str(steps)]
        cpp = shlex.split(args.mpirun) + ["-n", str(ranks), args.cpp, "--no-naive"] + common
        py = [sys.executable, os.path.join(HERE, "torch_gpt.py"), "--ranks", str(ranks)] + common
        c_ms, p_ms, ratio = [], [], []
        for r in range(args.rounds):
            c = run(cpp, r"^DDP \(buckets\+overlap\)\s+([0-9.]+)")
            t = run(py, r"^peer step_ms=([0-9.]+)")
            c_ms.append(c)
            p_ms.append(t)
            ratio.append(c / t)
            print(f"  {name} round {r + 1}/{args.rounds}: C++ {c:.1f} ms, PyTorch {t:.1f} ms, "
                  f"{c / t:.2f}x", flush=True)
        rows.append((name, what, statistics.median(c_ms), statistics.median(p_ms),
                     statistics.median(ratio), min(ratio), max(ratio)))
    print(f"\nmedian over {args.rounds} rounds (interleaved), milliseconds per step; "
          f"ratio = C++ / PyTorch per round")
    print(f"{'':<10} {'C++':>9} {'PyTorch':>9} {'ratio':>7} {'min..max':>12}  workload")
    for name, what, c, t, r, lo, hi in rows:
        print(f"{name:<10} {c:>9.1f} {t:>9.1f} {r:>6.2f}x {lo:>5.2f}..{hi:<5.2f}  {what}")


if __name__ == "__main__":
    main()
