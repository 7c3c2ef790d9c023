#!/usr/bin/env python3
"""Pipeline schedules with their bubbles (lab 12), from `lab12_run --json FILE`.

  schedules.py DATA.json --model OUT.svg      the event simulation of each schedule: the same
                                              picture on every machine
  schedules.py DATA.json --measured OUT.svg   the executed step of each schedule, as timed

One panel per schedule (GPipe, 1F1B, interleaved 1F1B), one row per rank; forwards blue,
backwards green, the bubble is the grey left between them. Labels are micro-batches (with the
model chunk after the dot when v > 1).
"""

import argparse

import matplotlib.patches as mpatches

import figlib
from figlib import plt

LIGHT_FORWARD, LIGHT_BACKWARD = "#8FA9D6", "#93CB9F"  # a rank's second model chunk
TITLES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}


def gantt(ax, actions, p, span, unit, axis_span):
    """Bars of `actions` (rank, name, start, end in the data's time) on p rows; time / unit."""
    for r in range(p):
        ax.barh(r, span / unit, left=0, height=0.8, color=figlib.IDLE, zorder=1)
    for a in actions:
        start, width = a["start"] / unit, (a["end"] - a["start"]) / unit
        forward = a["name"].startswith("F")
        chunk = int(a["name"].split(".")[1]) if "." in a["name"] else 0
        colour = (figlib.FORWARD if forward else figlib.BACKWARD) if chunk % 2 == 0 else \
            (LIGHT_FORWARD if forward else LIGHT_BACKWARD)
        ax.barh(a["rank"], width, left=start, height=0.8, color=colour, edgecolor="white",
                linewidth=0.6, zorder=2)
        label = a["name"][1:]  # micro-batch (.chunk)
        if width / (axis_span / unit) * 95 > len(label) + 1:  # ~95 characters across the axis
            ax.text(start + width / 2, a["rank"], label, ha="center", va="center",
                    fontsize=figlib.SMALL, color="white", zorder=3)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, span / unit)
    ax.spines["left"].set_visible(False)
    ax.tick_params(axis="y", length=0)


def figure(data, which):
    p, m = data["p"], data["m"]
    schedules = data["schedules"]
    fig, axes = plt.subplots(len(schedules), 1, squeeze=False,
                             figsize=(figlib.WIDTH, 1.2 + 1.25 * p * len(schedules) / 2.4))
    if which == "model":
        unit = data["forward_ms"]
        spans = [s["simulated"]["makespan"] for s in schedules]
    else:
        unit = 1.0
        spans = []
        for s in schedules:
            acts = s["measured"]["actions"]
            t0 = min(a["start"] for a in acts)
            for a in acts:
                a["start"], a["end"] = a["start"] - t0, a["end"] - t0
            spans.append(max(a["end"] for a in acts))
    span = max(spans)
    for ax, s, own_span in zip(axes[:, 0], schedules, spans):
        name = TITLES.get(s["name"], s["name"]) + (f", v = {s['v']}" if s["v"] > 1 else "")
        if which == "model":
            sim = s["simulated"]
            gantt(ax, sim["actions"], p, own_span, unit, span)
            peak = max(sim["peak_in_flight"])
            ax.set_title(f"{name}: bubble {100 * sim['bubble']:.1f}% ((p-1)/(vm+p-1) = "
                         f"{100 * s['formula']:.1f}%), up to {peak} chunks in flight",
                         loc="left")
        else:
            meas = s["measured"]
            gantt(ax, meas["actions"], p, own_span, unit, span)
            ax.set_title(f"{name}: measured bubble {100 * meas['bubble']:.1f}% "
                         f"(simulated {100 * s['simulated']['bubble']:.1f}%), step "
                         f"{meas['step_ms']:.0f} ms", loc="left")
        ax.set_xlim(0, span / unit)
    axes[-1, 0].set_xlabel("time (in forwards of one stage)" if which == "model" else "time (ms)")
    handles = [mpatches.Patch(color=figlib.FORWARD, label="forward"),
               mpatches.Patch(color=figlib.BACKWARD, label="backward (2x a forward)")]
    if any(s["v"] > 1 for s in schedules):
        handles += [mpatches.Patch(color=LIGHT_FORWARD, label="forward, chunk 1"),
                    mpatches.Patch(color=LIGHT_BACKWARD, label="backward, chunk 1")]
    handles.append(mpatches.Patch(color=figlib.IDLE, label="idle: the bubble"))
    fig.legend(handles=handles, loc="upper center", ncol=min(3, len(handles)), frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"Pipeline schedules: p = {p} ranks, m = {m} micro-batches", x=0.0, ha="left",
                 y=1.02, fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--model", help="write the simulated schedules here")
    ap.add_argument("--measured", help="write the measured steps here")
    ap.add_argument("--source", default="./lab run 12 -n 4 -- --json FILE")
    args = ap.parse_args()
    if args.model:
        figlib.save(figure(figlib.load(args.data), "model"), args.model,
                    args.source + " (the simulation: forward 1, backward 2)")
    if args.measured:
        data = figlib.load(args.data)
        quoted = {"p": data["p"], "m": data["m"], "schedules": [
            {"title": TITLES.get(s["name"], s["name"]) + (f" v = {s['v']}" if s["v"] > 1 else ""),
             "v": s["v"], "formula": s["formula"], "simulated": s["simulated"]["bubble"],
             "measured": s["measured"]["bubble"], "simulated_ms": s["simulated"]["makespan"],
             "measured_ms": s["measured"]["step_ms"],
             "peak": max(s["simulated"]["peak_in_flight"])} for s in data["schedules"]]}
        figlib.save(figure(data, "measured"), args.measured,
                    args.source + f" (emulated compute: forward {data['forward_ms']:g} ms, "
                    f"backward {data['backward_ms']:g} ms per stage)",
                    measured=figlib.machine(data["p"]), quoted=quoted)


if __name__ == "__main__":
    main()
