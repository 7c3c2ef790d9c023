#!/usr/bin/env python3
"""The tp / dp / pp rank grid of Megatron's process groups (lab 19), from `lab19_run --json`.

  grid.py DATA.json OUT.svg

Every rank drawn at its coordinates, read back from the group lists the run produced: one
column block per pipeline stage (a pp group runs left to right across them), one row per
data-parallel replica (a dp group is a column inside a stage), the tensor-parallel group as a
box of consecutive ranks. A model: the same on every machine.
"""

import argparse

import matplotlib.patches as mpatches

import figlib
from figlib import plt


def position(groups, token):
    """rank -> (index of its group, index inside it) for one group list."""
    out = {}
    for g, members in enumerate(groups.get(token, [])):
        for i, r in enumerate(members):
            out[r] = (g, i)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--source", default="./lab run 19 -- --json FILE")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    args = ap.parse_args()
    d = figlib.load(args.data)
    g = d["groups"]
    world, tp, cp, dp, pp = d["world"], d["tp"], d["cp"], d["dp"], d["pp"]
    tp_pos, pp_pos = position(g, "tp"), position(g, "pp")
    dp_pos, cp_pos = position(g, "dp"), position(g, "cp")
    cell, gap = 1.0, 0.8
    stage_w = tp * cell + gap

    def xy(r):
        x = pp_pos[r][1] * stage_w + tp_pos[r][1] * cell
        y = dp_pos[r][1] * cp + (cp_pos[r][1] if r in cp_pos else 0)
        return x, y

    rows = dp * cp
    fig, ax = plt.subplots(figsize=(1.2 + 0.62 * pp * stage_w, 1.6 + 0.62 * rows))
    for r in range(world):
        x, y = xy(r)
        node = r // args.ranks_per_node
        ax.add_patch(mpatches.FancyBboxPatch((x + 0.06, y + 0.06), cell - 0.12, cell - 0.12,
                                             boxstyle="round,pad=0,rounding_size=0.08",
                                             facecolor=figlib.rank_colour(node), alpha=0.85,
                                             edgecolor="none"))
        ax.text(x + cell / 2, y + cell / 2, str(r), ha="center", va="center", fontsize=9,
                color="white", fontweight="bold")
    for members in g.get("tp", []):
        xs = [xy(r) for r in members]
        x0, y0 = min(p[0] for p in xs), min(p[1] for p in xs)
        ax.add_patch(mpatches.Rectangle((x0, y0), len(members) * cell, cell, fill=False,
                                        edgecolor="#222222", linewidth=1.4))
    # A pipeline (pp group) flows from stage to stage: drawn for the first rank of each tp group.
    for members in g.get("pp", []):
        if tp_pos[members[0]][1] != 0:
            continue
        pts = [xy(r) for r in members]
        for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
            ax.annotate("", xy=(xb - 0.02, yb + 0.5), xytext=(xa + tp * cell + 0.02, ya + 0.5),
                        arrowprops={"arrowstyle": "->", "color": "#C44E52", "linewidth": 1.1})
    # A data-parallel group: the same cell of every replica, joined by a dashed line.
    for members in g.get("dp", []):
        pts = [xy(r) for r in members]
        ax.plot([p[0] + cell / 2 for p in pts], [p[1] + cell / 2 for p in pts], color="#333333",
                linestyle=(0, (2, 2)), linewidth=0.9, zorder=0)
    for s in range(pp):
        ax.text(s * stage_w + tp * cell / 2, -0.25, f"pipeline stage {s}", ha="center",
                va="bottom", fontsize=8.5, fontweight="bold")
    for k in range(rows):
        label = f"dp {k // cp}" + (f", cp {k % cp}" if cp > 1 else "")
        ax.text(-0.15, k + cell / 2, label, ha="right", va="center", fontsize=8)
    ax.set_xlim(-1.1, pp * stage_w)
    ax.set_ylim(rows + 0.2, -0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    nodes = (world + args.ranks_per_node - 1) // args.ranks_per_node
    handles = [mpatches.Patch(color=figlib.rank_colour(n), alpha=0.85,
                              label=f"node {n} (ranks {n * args.ranks_per_node}-"
                                    f"{min(world, (n + 1) * args.ranks_per_node) - 1})")
               for n in range(nodes)]
    handles += [mpatches.Patch(facecolor="none", edgecolor="#222222", label=f"tp group ({tp} ranks)"),
                mpatches.Patch(color="#C44E52", label=f"pp group: activations flow ({pp} stages)"),
                plt.Line2D([], [], color="#333333", linestyle=(0, (2, 2)),
                           label=f"dp group ({dp} replicas of the same cell)")]
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False,
               bbox_to_anchor=(0.5, 0.02))
    fig.suptitle(f"{world} ranks as tp {tp} x cp {cp} x dp {dp} x pp {pp}\n(Megatron's order "
                 f"{d['order']}, first fastest)", x=0.0, ha="left", fontsize=figlib.SUPTITLE,
                 fontweight="bold")
    figlib.save(fig, args.out, args.source + " (the groups the run generated)")


if __name__ == "__main__":
    main()
