#!/usr/bin/env python3
"""Regenerate the course's figures from the labs' own runs (./lab figures).

For each lab: run its demo (the reference solution, or your code with --side student) with the
flag that writes its data (--json FILE, or --trace FILE), then draw the SVGs from that data with
the figure script of its family. `./lab figures` builds the demos and calls this script; run by
hand it needs the binaries already built:

  make_figures.py --bin build/bin --out notes/figures --data build/figures-data
                  [--side reference] [--labs 12,03] [--mpirun "mpirun --oversubscribe"]
                  [--runs K] [--max-load L] [--wait-load S] [--allow-load]
  make_figures.py --targets [--side student] [--labs 12]     the build targets it needs
  make_figures.py --check-quoted [--root REPO]               the notes' quoted numbers against
                                                            the committed figures (no runs)

Measurements are repeated: a lab whose figures show timings runs its demo K times (--runs,
default 5; 1 for the labs whose figures draw layouts, models or byte counts) and its figures
are drawn from the per-point median (sweeps) or from the run of median step time (timelines:
a real trace, not an average of traces). A loaded machine stretches every timing, so before
each run the 1-minute load average is read: above what the previous run of the demo still
leaves in it plus a margin (--max-load, default max(1, cores / 4)) the script waits up to
--wait-load seconds (default 0) for it to fall, then refuses, naming the load; --allow-load
draws anyway and prints "drawn under load X on N cores" under each measured figure. Every
measured figure's footer says how it was measured (median of K runs, CPU, cores, date).

Drawing into the repository's notes/figures also rewrites the numbers the notes quote beside
each measured figure (the Markdown between <!-- figure-data NAME begin/end --> markers,
tools/figures/figdata.py) from the data the figure was drawn from.

Each recipe below is the one place that says which run makes which figure.
"""

import argparse
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import figdata

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

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


# The labs whose figures show timings: their demos run --runs times (the others once: layouts,
# models and byte counts do not change from run to run).
TIMED = {"03", "04", "06", "07", "12", "13", "16"}
# The data files of a lab's runs (combined over the runs into the file of the same name).
STEPS_04 = 3  # lab 04's --steps: the median run is chosen by the drawn steps' times


def fill(args, **kw):
    return [a.format(**kw) for a in args]


def load1():
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


class Load:
    """The load gate: other work on the machine must stay under `margin` (load average units)
    beyond what our own last run still leaves in the 1-minute average. That is what the run
    added to the average (the load after it less the load before it, decayed over the run),
    counted as at least its ranks and at most twice them (a rank's communication threads
    count too), decaying with the average's one-minute time constant since the run ended."""

    def __init__(self, margin, wait, allow):
        self.margin, self.wait, self.allow = margin, wait, allow
        self.cores = os.cpu_count() or 1
        self.added, self.last_end = 0.0, None
        self.start, self.before = None, 0.0
        self.worst = 0.0  # the highest load above the budget seen before a run (--allow-load)

    def own(self):
        if self.last_end is None:
            return 0.0
        return self.added * math.exp(-(time.time() - self.last_end) / 60.0)

    def budget(self):
        return self.own() + self.margin

    def gate(self, what):
        """Before a run: True to go on, False to refuse (the message printed)."""
        deadline = time.time() + self.wait
        while True:
            load = load1()
            if load <= self.budget():
                self.start, self.before = time.time(), load
                return True
            if time.time() >= deadline:
                break
            time.sleep(min(5.0, max(0.5, deadline - time.time())))
        msg = (f"figures: {what}: the machine is loaded: 1-minute load average {load:.2f} on "
               f"{self.cores} cores, above {self.budget():.2f} (this run's own "
               f"{self.own():.2f} + --max-load {self.margin:g})")
        if self.allow:
            self.worst = max(self.worst, load)
            print(msg + "; drawing anyway (--allow-load): the figures will say so", flush=True)
            self.start, self.before = time.time(), load
            return True
        print(msg + (f", still after waiting {self.wait:g} s" if self.wait else "") +
              ". Timings would be stretched by the other work. Wait for a quiet machine, "
              "or --wait-load SECONDS, or --allow-load to draw anyway (marked on the figure).",
              file=sys.stderr)
        return False

    def ran(self, ranks):
        now = time.time()
        if self.start is not None:
            added = load1() - self.before * math.exp(-(now - self.start) / 60.0)
            self.added = min(max(added, float(ranks)), 2.0 * ranks)
        self.last_end, self.start = now, None


def run_demo(n, ranks, runs, exe, mpirun, data, log):
    """Runs lab n's demo (all its argument sets) once into directory `data`. True when it
    worked."""
    for run in runs:
        cmd = mpirun + ["-n", str(ranks), str(exe)] + fill(run, data=data)
        with open(log, "a") as f:
            f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            f.flush()
            res = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if res.returncode != 0:
            print(f"figures: lab {n}: the demo failed ({res.returncode}); its output: {log}",
                  file=sys.stderr)
            return False
    return True


def data_files(runs, data):
    """The files a lab's demo writes (the {data}/FILE arguments)."""
    return [Path(a.format(data=data)).name for run in runs for a in run if "{data}/" in a]


def combine(n, data, k, files):
    """Combines the K runs' files (data/run-i/FILE) into data/FILE. Returns how (a phrase)."""
    how = "1 run"
    for name in files:
        docs = []
        for i in range(k):
            with open(data / f"run-{i}" / name) as f:
                docs.append(json.load(f))
        doc, how = figdata.combine(n, docs, steps=STEPS_04)
        with open(data / name, "w") as f:
            json.dump(doc, f)
    return how


def check_quoted(root):
    problems, pending = figdata.check(root)
    for p in pending:
        print(f"figures: pending: {p}")
    for p in problems:
        print(f"figures: {p}", file=sys.stderr)
    n = len(figdata.blocks(root))
    print(f"figures: {n} quoted blocks, {len(problems)} differ from their figures, "
          f"{len(pending)} wait for a redraw")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--bin", type=Path, help="the build's bin/ directory")
    ap.add_argument("--out", type=Path, help="where the SVGs go")
    ap.add_argument("--data", type=Path, help="where the runs' data and logs go")
    ap.add_argument("--side", default="reference", choices=["reference", "student"])
    ap.add_argument("--labs", default="", help="comma-separated lab numbers (default: all)")
    ap.add_argument("--mpirun", default="mpirun", help="mpirun and its flags, one string")
    ap.add_argument("--targets", action="store_true", help="print the build targets and exit")
    ap.add_argument("--runs", type=int, default=5,
                    help="runs per lab whose figures show timings (median drawn; default 5)")
    cores = os.cpu_count() or 1
    ap.add_argument("--max-load", type=float, default=max(1.0, cores / 4),
                    help="load average allowed from other work (default max(1, cores/4))")
    ap.add_argument("--wait-load", type=float, default=0.0,
                    help="seconds to wait for the load to fall before refusing (default 0)")
    ap.add_argument("--allow-load", action="store_true",
                    help="draw on a loaded machine; the figures say under which load")
    ap.add_argument("--quoted", choices=["auto", "yes", "no"], default="auto",
                    help="rewrite the notes' quoted numbers from the figures drawn (auto: when --out "
                         "is notes/figures)")
    ap.add_argument("--check-quoted", action="store_true",
                    help="check the notes' quoted numbers against the committed figures, exit")
    ap.add_argument("--draw-only", action="store_true",
                    help="draw from the data already in --data (no runs): to work on the looks")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args()
    if args.check_quoted:
        return check_quoted(args.root)
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
        ap.error("--bin, --out and --data are needed (or --targets, --check-quoted)")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    out, data = args.out.resolve(), args.data.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    quoted = args.quoted == "yes" or (args.quoted == "auto" and
                                      out == (args.root / "notes" / "figures").resolve())
    mpirun = shlex.split(args.mpirun)
    gate = Load(args.max_load, args.wait_load, args.allow_load)
    failed, drawn, refused, total0 = [], [], False, time.time()
    for n in labs:
        ranks, demo_args, figures = RECIPES[n]
        runs = demo_args if demo_args and isinstance(demo_args[0], list) else [demo_args]
        exe = args.bin / f"lab{n}_run_{args.side}"
        k = args.runs if n in TIMED else 1
        t0 = time.time()
        log = data / f"lab{n}.log"
        meta = data / f"lab{n}.runs.json"  # how the runs went: --draw-only draws as they were
        if not args.draw_only:
            log.write_text("")
        ok, seen = True, []
        gate.worst = 0.0  # this lab's runs only
        for i in range(0 if args.draw_only else k):
            if n in TIMED and not gate.gate(f"lab {n}, run {i + 1} of {k}"):
                refused, ok = True, False
                break
            seen.append(load1())
            run_dir = data / f"run-{i}"
            run_dir.mkdir(exist_ok=True)
            ok = run_demo(n, ranks, runs, exe, mpirun, run_dir, log)
            gate.ran(ranks)
            if not ok:
                break
        t_run = time.time() - t0
        if refused:
            break
        if not ok:
            failed.append(n)
            continue
        if args.draw_only:
            files = data_files(runs, data)
            before = json.loads(meta.read_text()) if meta.is_file() else {}
            k = 0
            while k < before.get("runs", args.runs if n in TIMED else 1) and \
                    all((data / f"run-{k}" / f).is_file() for f in files):
                k += 1
            if k == 0:
                print(f"figures: lab {n}: no runs in {data}", file=sys.stderr)
                failed.append(n)
                continue
            seen, loaded = before.get("loads", [load1()]), before.get("loaded")
            date = before.get("date", datetime.date.today().isoformat())
        else:
            loaded = gate.worst if n in TIMED and gate.worst > 0 else None
            date = datetime.date.today().isoformat()
            meta.write_text(json.dumps({"runs": k, "loads": seen, "loaded": loaded,
                                        "date": date}) + "\n")
        how = combine(n, data, k, data_files(runs, data))
        made = []
        # What a reader types to get the same data: ./lab run with these arguments.
        source = "; ".join(
            f"./lab run {n} -n {ranks}{' --solutions' if args.side == 'reference' else ''} -- "
            + " ".join(re.sub(r"\{data\}/\S+", "FILE", a) for a in run) for run in runs)
        # How the figure was measured, printed under it (figlib.machine reads it).
        env = dict(os.environ, DTL_FIGURE_MEASUREMENT=json.dumps({
            "how": how, "date": date, "cpu": figdata.cpu(),
            "loaded": None if loaded is None else f"drawn under load {loaded:.1f} on "
                                                  f"{gate.cores} cores"}))
        for fig in figures:
            cmd = [sys.executable, str(HERE / fig[0])] + fill(fig[1:], data=data, out=out)
            cmd += ["--source", source]
            svgs = [os.path.basename(a) for a in cmd if a.endswith(".svg")]
            if subprocess.run(cmd, env=env).returncode != 0:
                print(f"figures: lab {n}: {fig[0]} failed: {' '.join(cmd)}", file=sys.stderr)
                failed.append(n)
            else:
                drawn += [m[:-4] for m in svgs]
            made += svgs
        print(f"  lab {n}: {k} run{'s' if k > 1 else ''} {t_run:5.1f} s (load "
              f"{min(seen):.1f}-{max(seen):.1f}), drawn {time.time() - t0 - t_run:4.1f} s: "
              f"{', '.join(made)}", flush=True)
    if quoted:
        changed = figdata.update(args.root, set(drawn), out)
        for path in changed:
            print(f"  quoted numbers rewritten: {path.relative_to(args.root)}")
    elif args.quoted == "auto" and any(name in figdata.RENDER for name in drawn):
        print("  (the notes' quoted numbers are rewritten only when drawing into notes/figures; "
              "--quoted yes forces it)")
    if refused:
        print(f"figures: stopped at a loaded machine; drawn: {', '.join(drawn) or 'nothing'}",
              file=sys.stderr)
        return 3
    print(f"figures: {len(labs) - len(set(failed))} of {len(labs)} labs in "
          f"{time.time() - total0:.0f} s -> {out} (data: {data})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
