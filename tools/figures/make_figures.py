#!/usr/bin/env python3
"""Regenerate the course's figures from the labs' own runs (./lab figures).

For each lab: run its demo (the reference solution, or your code with --side student) with the
flag that writes its data (--json FILE, or --trace FILE), then draw the SVGs from that data with
the figure script of its family. `./lab figures` builds the demos and calls this script; run by
hand it needs the binaries already built:

  make_figures.py --bin build/bin --out notes/figures --data build/figures-data
                  [--side reference] [--labs 12,03] [--mpirun "mpirun --oversubscribe"]
  make_figures.py --targets [--side student] [--labs 12]     the build targets it needs

Each recipe below is the one place that says which run makes which figure.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# lab -> (ranks, demo arguments, [figure script commands]). {data} is the data directory,
# {out} the figures directory, {demo} the demo's command as a user would type it.
RECIPES = {
    "03": (4, ["--json", "{data}/lab03.json"],
           [["busbw.py", "ring", "{data}/lab03.json", "{out}/03-busbw.svg"],
            ["ring.py", "{out}/03-ring-allreduce.svg"]]),
    "04": (4, ["--net", "pcie", "--trace", "{data}/lab04-trace.json", "--steps", "3"],
           [["timeline.py", "ddp", "{data}/lab04-trace.json", "{out}/04-ddp-timeline.svg",
             "--steps", "3"]]),
    "06": (1, ["--json", "{data}/lab06.json"],
           [["memory.py", "step", "{data}/lab06.json", "{out}/06-memory-step.svg"]]),
    "07": (4, [["--net", "eth-2node", "--json", "{data}/lab07-eth.json"],
               ["--net", "ib-2node", "--json", "{data}/lab07-ib.json"]],
           [["busbw.py", "topology", "{out}/07-hierarchical-busbw.svg", "{data}/lab07-eth.json",
             "{data}/lab07-ib.json"]]),
    "08": (4, ["--widths", "128", "--iters", "1", "--json", "{data}/lab08.json"],
           [["layouts.py", "mlp", "{data}/lab08.json", "{out}/08-column-row.svg"]]),
    "09": (4, ["--tp", "4", "--steps", "1", "--json", "{data}/lab09.json"],
           [["layouts.py", "block", "{data}/lab09.json", "{out}/09-tp-block.svg"]]),
    "10": (4, ["--lengths", "256", "512", "1024", "2048", "--json", "{data}/lab10.json"],
           [["layouts.py", "sequence", "{data}/lab10.json", "{out}/10-sequence-parallel.svg"],
            ["layouts.py", "ring", "{data}/lab10.json", "{out}/10-ring-attention.svg"]]),
    "11": (4, ["--layers", "10", "--vocab", "4096", "--steps", "2", "--json",
               "{data}/lab11.json"],
           [["stages.py", "{data}/lab11.json", "{out}/11-stage-split.svg"]]),
    "12": (4, ["--json", "{data}/lab12.json"],
           [["schedules.py", "{data}/lab12.json", "--model", "{out}/12-schedules.svg",
             "--measured", "{out}/12-schedules-measured.svg"]]),
    "13": (1, ["--iters", "2", "--json", "{data}/lab13.json"],
           [["memory.py", "recompute", "{data}/lab13.json", "{out}/13-memory-recompute.svg"]]),
    "14": (4, ["--steps", "3", "--json", "{data}/lab14.json"],
           [["sharding.py", "zero", "{data}/lab14.json", "{out}/14-zero-stages.svg"]]),
    "15": (4, ["--steps", "2", "--json", "{data}/lab15.json"],
           [["sharding.py", "fsdp", "{data}/lab15.json", "{out}/15-fsdp-strategies.svg"]]),
    "16": (4, ["--steps", "2", "--json", "{data}/lab16.json"],
           [["timeline.py", "overlap", "{data}/lab16.json", "--matmul",
             "{out}/16-collective-matmul.svg", "--fsdp", "{out}/15-fsdp-timeline.svg"]]),
    "19": (1, ["--json", "{data}/lab19.json"],
           [["grid.py", "{data}/lab19.json", "{out}/19-rank-grid.svg"]]),
    "20": (1, ["--model", "llama2-70b-like", "--cluster", "h100-80g:512", "--batch", "1024",
               "--json", "{data}/lab20.json"],
           [["planner.py", "{data}/lab20.json", "{out}/20-planner.svg", "--title",
             "a 70B model on 512 H100s, 1024 sequences per step"]]),
}


def fill(args, **kw):
    return [a.format(**kw) for a in args]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, help="the build's bin/ directory")
    ap.add_argument("--out", type=Path, help="where the SVGs go")
    ap.add_argument("--data", type=Path, help="where the runs' data and logs go")
    ap.add_argument("--side", default="reference", choices=["reference", "student"])
    ap.add_argument("--labs", default="", help="comma-separated lab numbers (default: all)")
    ap.add_argument("--mpirun", default="mpirun", help="mpirun and its flags, one string")
    ap.add_argument("--targets", action="store_true", help="print the build targets and exit")
    args = ap.parse_args()
    labs = [f"{int(x):02d}" for x in args.labs.replace(" ", ",").split(",") if x] or list(RECIPES)
    unknown = [n for n in labs if n not in RECIPES]
    if unknown:
        print(f"figures: no figure comes from lab(s) {' '.join(unknown)}; labs with figures: "
              f"{' '.join(RECIPES)}", file=sys.stderr)
        return 2
    if args.targets:
        print(" ".join(f"lab{n}_run_{args.side}" for n in labs))
        return 0
    if not args.bin or not args.out or not args.data:
        ap.error("--bin, --out and --data are needed (or --targets)")
    out, data = args.out.resolve(), args.data.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    mpirun = shlex.split(args.mpirun)
    failed, total0 = [], time.time()
    for n in labs:
        ranks, demo_args, figures = RECIPES[n]
        runs = demo_args if demo_args and isinstance(demo_args[0], list) else [demo_args]
        exe = args.bin / f"lab{n}_run_{args.side}"
        t0 = time.time()
        ok = True
        for run in runs:
            cmd = mpirun + ["-n", str(ranks), str(exe)] + fill(run, data=data)
            log = data / f"lab{n}.log"
            with open(log, "a" if run is not runs[0] else "w") as f:
                f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
                f.flush()
                res = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
            if res.returncode != 0:
                print(f"figures: lab {n}: the demo failed ({res.returncode}); its output: {log}",
                      file=sys.stderr)
                ok = False
                break
        t_run = time.time() - t0
        if not ok:
            failed.append(n)
            continue
        made = []
        # What a reader types to get the same data: ./lab run with these arguments.
        source = "; ".join(
            f"./lab run {n} -n {ranks}{' --solutions' if args.side == 'reference' else ''} -- "
            + " ".join(re.sub(r"\{data\}/\S+", "FILE", a) for a in run) for run in runs)
        for fig in figures:
            cmd = [sys.executable, str(HERE / fig[0])] + fill(fig[1:], data=data, out=out)
            cmd += ["--source", source]
            if subprocess.run(cmd).returncode != 0:
                print(f"figures: lab {n}: {fig[0]} failed: {' '.join(cmd)}", file=sys.stderr)
                failed.append(n)
            made += [os.path.basename(a) for a in cmd if a.endswith(".svg")]
        print(f"  lab {n}: run {t_run:5.1f} s, drawn {time.time() - t0 - t_run:4.1f} s: "
              f"{', '.join(made)}", flush=True)
    print(f"figures: {len(labs) - len(set(failed))} of {len(labs)} labs in "
          f"{time.time() - total0:.0f} s -> {out} (data: {data})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
