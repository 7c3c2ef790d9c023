#!/usr/bin/env python3
"""Where to cut a GPT into pipeline stages (lab 11), from `lab11_run --json FILE`.

  stages.py DATA.json OUT.svg

Two cuts of the same units (embedding, blocks, head) over p stages: by unit count (split_range)
and by cost (lab 11's partition). Each bar is a stage, stacked from its units' forward FLOPs per
token; the slowest stage sets the pipeline's pace, so the cut that lowers the tallest bar wins.
A model: the same on every machine.
"""

import argparse

import figlib
from figlib import plt


def unit_name(u, n_units):
    if u == 0:
        return "embed"
    if u == n_units - 1:
        return "head"
    return f"block {u - 1}"


def panel(ax, costs, cut, title, top):
    n = len(costs)
    totals = []
    for s, (b, e) in enumerate(cut["parts"]):
        bottom = 0.0
        for u in range(b, e):
            h = costs[u] / 1e6
            ax.bar(s, h, bottom=bottom, width=0.7, color=figlib.rank_colour(s),
                   edgecolor="white", linewidth=1.0)
            if h > 0.045 * top:
                ax.text(s, bottom + h / 2, unit_name(u, n), ha="center", va="center",
                        fontsize=figlib.SMALL, color="white")
            bottom += h
        totals.append(bottom)
        ax.text(s, bottom + 0.01 * top, f"{bottom:.2f}", ha="center", va="bottom",
                fontsize=figlib.SMALL)
    mean = sum(totals) / len(totals)
    ax.axhline(mean, color="#333333", linestyle="--", linewidth=0.8)
    ax.text(-0.45, mean, "mean ", va="bottom", ha="left", fontsize=figlib.SMALL)
    ax.set_xticks(range(len(totals)), [f"stage {s}\n(rank {s})" for s in range(len(totals))])
    ax.set_ylim(0, top * 1.08)
    ax.set_title(f"{title}:\nslowest / mean = {cut['imbalance']:.2f}", loc="left")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--source", default="./lab run 11 -n 4 -- --json FILE")
    args = ap.parse_args()
    d = figlib.load(args.data)
    costs = d["costs"]

    def stage_max(cut):
        return max(sum(costs[b:e]) for b, e in cut["parts"]) / 1e6

    top = max(stage_max(d["even"]), stage_max(d["balanced"]))
    fig, axes = plt.subplots(1, 2, figsize=(figlib.WIDTH, 3.6), sharey=True)
    panel(axes[0], costs, d["even"], "even cut (by unit count)", top)
    panel(axes[1], costs, d["balanced"], "balanced cut (partition, by cost)", top)
    axes[0].set_ylabel("forward MFLOPs per token")
    fig.suptitle(f"Stage split of a {figlib.short_model(d['model'])}\nover p = {d['p']} stages",
                 x=0.0, ha="left", fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source)


if __name__ == "__main__":
    main()
