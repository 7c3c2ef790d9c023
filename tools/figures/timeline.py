#!/usr/bin/env python3
"""Timelines straight from Chrome traces (labs 04, 15, 16, and any run with --trace).

  timeline.py trace TRACE.json OUT.svg [--window NAME:K ...]
        any trace the runtime wrote (--trace FILE): one row per rank and track; --window
        forward:3 draws from the start of the 4th "forward" to the start of the next (several
        windows: one panel each, on the same time scale)
  timeline.py ddp TRACE.json OUT.svg --steps S
        lab 04 (`lab04_run --trace`): the last naive step against the last DDP step
  timeline.py overlap DATA.json --matmul OUT.svg --fsdp OUT.svg
        lab 16 (`lab16_run --json`): the all-gather matmul plain vs ring, and an FSDP step
        without and with prefetch, with rank 0's live bytes under it (each unit's gather and
        release)

Compute is what the code marked with DTL_SCOPE; every Comm op is a bar on its Comm's row, from
when its worker started it to when it completed (under the network emulator that includes
waiting for the slowest rank). A measurement: the machine is printed under the figure.
"""

import argparse
import re

import matplotlib.patches as mpatches

import figdata
import figlib
from figlib import plt

OPS = {"all_reduce": "#DD8452", "all_gather": "#8172B3", "reduce_scatter": "#937860",
       "broadcast": "#CCB974", "send": "#8C8C8C", "recv": "#8C8C8C", "sendrecv": "#8C8C8C",
       "all_to_all": "#DA8BC3", "barrier": "#CCCCCC", "reduce": "#DD8452"}
COMPUTE = [("forward", figlib.FORWARD), ("backward", figlib.BACKWARD),
           ("optimizer", "#CCB974"), ("", "#64B5CD")]


def read(trace, ranks=None, barriers=True):
    """Chrome trace (dict or list) -> events [dict(rank, track, name, cat, start, end, bytes)];
    only ranks below `ranks` when given; without the barriers (a window's synchronisation) when
    barriers is False."""
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {(e["pid"], e.get("tid", 0)): e["args"]["name"]
             for e in raw if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = []
    for e in raw:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if ranks is not None and e["pid"] >= ranks:
            continue
        if not barriers and e["name"].startswith("barrier"):
            continue
        out.append({"rank": e["pid"], "track": names.get((e["pid"], e.get("tid", 0)), "compute"),
                    "name": e["name"], "cat": e.get("cat", ""), "start": e["ts"] / 1e6,
                    "end": (e["ts"] + e.get("dur", 0)) / 1e6,
                    "bytes": args.get("bytes") if isinstance(args, dict) else None})
    return out


def window(events, spec):
    """'NAME:K': from the K-th start of an event called NAME (rank 0; K < 0 counts from the end)
    to the next one, or to the end of the trace."""
    name, k = spec.rsplit(":", 1)
    starts = sorted(e["start"] for e in events if e["rank"] == 0 and e["name"] == name)
    if not starts:
        raise SystemExit(f"timeline: no event called '{name}' on rank 0")
    k = int(k) % len(starts)
    lo = starts[k]
    hi = starts[k + 1] if k + 1 < len(starts) else max(e["end"] for e in events)
    return lo, hi


def op_of(name):
    m = re.match(r"([a-z_]+)", name)
    return m.group(1) if m else name


def compute_colour(name):
    for prefix, colour in COMPUTE:
        if name.startswith(prefix):
            return colour
    return COMPUTE[-1][1]


def rows_of(events):
    keys = sorted({(e["rank"], e["track"]) for e in events},
                  key=lambda k: (k[0], k[1] != "compute", k[1]))
    return {k: i for i, k in enumerate(keys)}


def draw(ax, events, lo, hi, rows=None, label_ops=True, axis_span=None):
    """Gantt of the events within [lo, hi] on ax; times in ms from lo; axis_span (s): the
    axis's length when longer than hi - lo (panels on one time scale)."""
    full = max(hi - lo, axis_span or 0.0)
    evs = [e for e in events if e["end"] > lo and e["start"] < hi]
    rows = rows or rows_of(evs)
    for (rank, track), y in rows.items():
        ax.barh(y, (hi - lo) * 1e3, left=0, height=0.78, color=figlib.IDLE, zorder=1)
    for e in evs:
        y = rows.get((e["rank"], e["track"]))
        if y is None:
            continue
        s, t = max(e["start"], lo), min(e["end"], hi)
        x, w = (s - lo) * 1e3, (t - s) * 1e3
        comm = e["cat"] == "comm"
        colour = OPS.get(op_of(e["name"]), "#DD8452") if comm else compute_colour(e["name"])
        ax.barh(y, w, left=x, height=0.78, color=colour, edgecolor="white", linewidth=0.4,
                zorder=2)
        text = e["name"].split(" ")[0]
        if comm and e.get("bytes"):
            text = figlib.human_bytes(e["bytes"])
        if not comm and e["name"].startswith(("forward block", "forward root")):
            text = e["name"].replace("forward ", "").replace("block ", "b").replace(" (embed)", "").replace(" (head)", "")
        # ~0.6 em per character of SMALL pt, on an axis about 6.2 in (450 pt) wide
        if (label_ops or not comm) and w > full * 1e3 * 0.6 * figlib.SMALL / 450 * len(text):
            ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=figlib.SMALL,
                    color="white", zorder=3, clip_on=True)
    comms = {}  # rank -> its communication tracks: one is "comm", several by their last name
    for r, t in rows:
        if t != "compute":
            comms[r] = comms.get(r, 0) + 1
    ax.set_yticks(list(rows.values()),
                  [f"rank {r} " + ("compute" if t == "compute" else "comm" if comms[r] == 1
                                   else "comm " + t.split("/")[-1]) for r, t in rows])
    ax.tick_params(axis="y", length=0, labelsize=figlib.SMALL)
    ax.spines["left"].set_visible(False)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, (hi - lo) * 1e3)
    return rows


def legend(fig, events):
    """The colours of what is drawn: compute kinds, comm ops, idle."""
    kinds = []
    for e in events:
        if e["cat"] == "comm":
            continue
        kind = next(p for p, _ in COMPUTE if e["name"].startswith(p))
        if kind not in kinds:
            kinds.append(kind)
    handles = [mpatches.Patch(color=c, label=p or "other compute") for p, c in COMPUTE
               if p in kinds]
    ops = sorted({op_of(e["name"]) for e in events if e["cat"] == "comm"})
    handles += [mpatches.Patch(color=OPS.get(o, "#DD8452"), label=o) for o in ops]
    handles.append(mpatches.Patch(color=figlib.IDLE, label="idle"))
    fig.legend(handles=handles, loc="upper center", ncol=min(6, len(handles)), frameon=False,
               bbox_to_anchor=(0.5, 0.0))


def panels(events, windows, titles, suptitle):
    spans = [hi - lo for lo, hi in windows]
    shown = [e for e in events if any(e["end"] > lo and e["start"] < hi for lo, hi in windows)]
    rows = rows_of(shown)
    fig, axes = plt.subplots(len(windows), 1, squeeze=False,
                             figsize=(figlib.WIDTH, 0.8 + len(windows) * (0.5 + 0.24 * len(rows))))
    for ax, (lo, hi), title in zip(axes[:, 0], windows, titles):
        draw(ax, events, lo, hi, rows, axis_span=max(spans))
        ax.set_xlim(0, max(spans) * 1e3)
        ax.set_title(title.format(ms=(hi - lo) * 1e3), loc="left")
    axes[-1, 0].set_xlabel("time (ms)")
    legend(fig, shown)
    fig.suptitle(suptitle, x=0.0, ha="left", fontsize=figlib.SUPTITLE, fontweight="bold", y=1.0)
    fig.tight_layout()
    return fig


def ranks_in(events):
    return len({e["rank"] for e in events})


def cmd_trace(args):
    events = read(figlib.load(args.trace))
    if args.window:
        windows = [window(events, w) for w in args.window]
    else:
        windows = [(min(e["start"] for e in events), max(e["end"] for e in events))]
    titles = args.title or [f"{w}: {{ms:.1f}} ms" for w in (args.window or ["the whole trace"])]
    fig = panels(events, windows, titles, args.suptitle or f"Timeline of {args.trace}")
    figlib.save(fig, args.out, args.source or f"--trace {args.trace}",
                measured=figlib.machine(ranks_in(events)))


def cmd_ddp(args):
    events = read(figlib.load(args.trace))
    s = args.steps
    windows = [window(events, f"forward:{s - 1}"), window(events, f"forward:{2 * s - 1}")]
    fig = panels(events, windows,
                 ["naive: one blocking all-reduce per parameter after backward, {ms:.0f} ms",
                  "DDP: buckets all-reduced while backward still runs, {ms:.0f} ms"],
                 "One training step, naive vs DDP (lab 04)")
    # The numbers the notes quote beside it: rank 0's time in the two drawn steps.
    raw = figlib.load(args.trace)
    naive, ddp = figdata.ddp_steps(raw, s)
    rank0 = figdata.trace_events(raw, rank=0)
    figlib.save(fig, args.out, args.source or
                f"./lab run 04 -n {ranks_in(events)} --net pcie --trace FILE -- --steps {s}",
                measured=figlib.machine(ranks_in(events)),
                quoted={"naive": figdata.busy(rank0, *naive), "ddp": figdata.busy(rank0, *ddp)})


def cmd_overlap(args):
    d = figlib.load(args.data)
    n = d["ranks"]
    net = d["network"].split(":")[0]
    if args.matmul and "matmul" in d:
        mm = d["matmul"]
        plain, ring = read(mm["plain"], barriers=False), read(mm["ring"], barriers=False)
        span = max(max(e["end"] for e in ev) - min(e["start"] for e in ev) for ev in (plain, ring))
        rows = rows_of(plain + ring)
        fig, axes = plt.subplots(2, 1, figsize=(figlib.WIDTH, 0.9 + 2 * (0.5 + 0.24 * len(rows))))
        modes = []
        for ax, key, ev, title in ((axes[0], "plain", plain, "plain: all-gather x, then one matmul"),
                                   (axes[1], "ring", ring, "ring: each chunk's transfer under the "
                                                           "previous chunk's matmul")):
            lo, hi = min(e["start"] for e in ev), max(e["end"] for e in ev)
            draw(ax, ev, lo, hi, rows, axis_span=span)
            ax.set_xlim(0, span * 1e3)
            ax.set_title(f"{title}: {(hi - lo) * 1e3:.1f} ms", loc="left")
            rank0 = figdata.trace_events(mm[key], rank=0)
            modes.append(dict(figdata.busy(rank0, lo, hi), title=key))
        axes[-1].set_xlabel("time (ms)")
        legend(fig, plain + ring)
        fig.suptitle(f"All-gather matmul, x [{mm['rows']} x {mm['k']}] per rank,\nW "
                     f"[{mm['n']} x {mm['k']}], {n} ranks, {net}", x=0.0, ha="left",
                     fontsize=figlib.SUPTITLE, fontweight="bold")
        fig.tight_layout()
        figlib.save(fig, args.matmul, args.source or f"./lab run 16 -n {n} -- --json FILE",
                    measured=figlib.machine(n), quoted={"modes": modes})
    if args.fsdp and "fsdp" in d:
        f = d["fsdp"]
        cases = [("no_prefetch", "no prefetch: each unit gathered when needed"),
                 ("prefetch", "prefetch: the next unit's gather under this unit's compute")]
        cases = [(k, t) for k, t in cases if f.get(k)]
        # Two ranks tell the story (the others do the same); no window barriers.
        traces = {k: read(f[k]["trace"], ranks=2, barriers=False) for k, _ in cases}
        spans = {k: (min(e["start"] for e in ev), max(e["end"] for e in ev))
                 for k, ev in traces.items()}
        span = max(hi - lo for lo, hi in spans.values())
        rows = rows_of([e for ev in traces.values() for e in ev])
        fig, axes = plt.subplots(2 * len(cases), 1, squeeze=False,
                                 figsize=(figlib.WIDTH, 1.0 + len(cases) * (1.7 + 0.24 * len(rows))),
                                 gridspec_kw={"height_ratios": [len(rows) * 0.24 + 0.3, 0.9] * len(cases)})
        top = max(b for k, _ in cases for _, b in f[k]["memory"]) if cases else 1
        quoted = []
        for i, (k, title) in enumerate(cases):
            lo, hi = spans[k]
            ax, mem = axes[2 * i, 0], axes[2 * i + 1, 0]
            draw(ax, traces[k], lo, hi, rows, axis_span=span)
            ax.set_xlim(0, span * 1e3)
            ax.set_title(f"{title}: {(hi - lo) * 1e3:.0f} ms", loc="left")
            quoted.append(dict(figdata.busy(figdata.trace_events(f[k]["trace"], rank=0), lo, hi),
                               title=k.replace("_", " ")))
            ax.tick_params(axis="x", labelbottom=False)
            samples = [(t, b) for t, b in f[k]["memory"] if lo <= t <= hi]
            mem.plot([(t - lo) * 1e3 for t, _ in samples], [figlib.mib(b) for _, b in samples],
                     drawstyle="steps-post", color="#222222", linewidth=0.9)
            mem.set_xlim(0, span * 1e3)
            mem.set_ylim(0, figlib.mib(top) * 1.1)
            mem.set_ylabel("rank 0\nMiB live", fontsize=figlib.SMALL)
            if i == 0:
                mem.set_title("rank 0's live bytes: activations pile up through forward, drain "
                              "in backward;\neach unit's gathered parameters come and go on top",
                              loc="left", fontsize=figlib.SMALL, fontweight="normal")
            mem.tick_params(labelsize=figlib.SMALL)
        axes[-1, 0].set_xlabel("time (ms)")
        legend(fig, [e for ev in traces.values() for e in ev])
        fig.suptitle(f"An FSDP step (FULL_SHARD), unit by unit: gather, compute, release\n"
                     f"{figlib.short_model(f['model'])}; {f['rows']} sequences per rank,\n{n} "
                     f"ranks (two drawn), {net}", x=0.0, ha="left", fontsize=figlib.SUPTITLE,
                     fontweight="bold")
        fig.tight_layout()
        figlib.save(fig, args.fsdp, args.source or f"./lab run 16 -n {n} -- --json FILE",
                    measured=figlib.machine(n), quoted={"cases": quoted})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace")
    t.add_argument("trace")
    t.add_argument("out")
    t.add_argument("--window", action="append", help="NAME:K, e.g. forward:3 (repeatable)")
    t.add_argument("--title", action="append", help="one per window; {ms} is its length")
    t.add_argument("--suptitle")
    t.add_argument("--source")
    d = sub.add_parser("ddp")
    d.add_argument("trace")
    d.add_argument("out")
    d.add_argument("--steps", type=int, required=True)
    d.add_argument("--source")
    o = sub.add_parser("overlap")
    o.add_argument("data")
    o.add_argument("--matmul")
    o.add_argument("--fsdp")
    o.add_argument("--source")
    args = ap.parse_args()
    {"trace": cmd_trace, "ddp": cmd_ddp, "overlap": cmd_overlap}[args.cmd](args)


if __name__ == "__main__":
    main()
