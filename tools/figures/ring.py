#!/usr/bin/env python3
"""The ring all-reduce of lab 03, step by step, on 4 ranks (a model: the same on every machine).

  ring.py OUT.svg [--ranks N]

Rows are ranks, each holding its tensor in N chunks; columns are the state after each step. Top,
reduce-scatter: in step s rank r sends its partial sum of chunk r-1-s to rank r+1, which adds it
to its own; a chunk's shade is how many ranks' contributions it holds, so after N-1 steps rank r
holds chunk r complete (darkest). Bottom, all-gather: in step s rank r forwards complete chunk
r-s, which rank r+1 stores as it is. The chunk each rank sends in the next step is outlined.
The same schedule as solutions/03's reference and notes/03's tables.
"""

import argparse

import matplotlib.patches as mpatches

import figlib
from figlib import plt


def schedule(n):
    """The states: [(title, holds, sends)], holds[r][c] = the set of ranks summed into rank r's
    chunk c, sends[r] = the chunk rank r sends in the next step (None after the last)."""
    holds = [[{r} for _ in range(n)] for r in range(n)]
    states = []
    for s in range(n - 1):  # reduce-scatter
        sends = [(r - 1 - s) % n for r in range(n)]
        states.append(("start" if s == 0 else f"after step {s - 1}", [row[:] for row in holds],
                       sends, "rs"))
        new = [row[:] for row in holds]
        for r in range(n):
            c = sends[r]
            new[(r + 1) % n][c] = holds[(r + 1) % n][c] | holds[r][c]
        holds = new
    for s in range(n - 1):  # all-gather
        sends = [(r - s) % n for r in range(n)]
        states.append(("start: the end of 1." if s == 0 else f"after step {s - 1}",
                       [row[:] for row in holds], sends, "ag"))
        new = [row[:] for row in holds]
        for r in range(n):
            c = sends[r]
            new[(r + 1) % n][c] = set(holds[r][c])
        holds = new
    states.append((f"after step {n - 2}", [row[:] for row in holds], [None] * n, "ag"))
    return states


def shade(k, n):
    """Light for one rank's contribution, dark for the complete sum of all n."""
    light, dark = (0.86, 0.90, 0.96), (0.12, 0.26, 0.55)
    t = (k - 1) / max(n - 1, 1)
    return tuple(a + (b - a) * t for a, b in zip(light, dark))


def panel(ax, x0, y0, holds, sends, n, size, gap):
    for r in range(n):
        y = y0 - r * (size + gap)
        for c in range(n):
            x = x0 + c * size
            k = len(holds[r][c])
            ax.add_patch(mpatches.Rectangle((x, y - size), size, size, facecolor=shade(k, n),
                                            edgecolor="white", linewidth=1.2))
            ax.text(x + size / 2, y - size / 2, str(k), ha="center", va="center", fontsize=10,
                    color="white" if k > n / 2 else "#1F2D4D")
        if sends[r] is not None:
            x = x0 + sends[r] * size
            ax.add_patch(mpatches.Rectangle((x + 0.04, y - size + 0.04), size - 0.08, size - 0.08,
                                            fill=False, edgecolor=figlib.COMM, linewidth=2.4))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=4)
    # ./lab figures passes the demo's command to every figure; a model needs none.
    ap.add_argument("--source", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.ranks
    states = schedule(n)
    size, gap, col = 1.0, 0.35, n + 1.6
    fig, ax = plt.subplots(figsize=(7.6, 7.4))
    ax.set_axis_off()
    rows_h = n * (size + gap)
    for half, (label, first) in enumerate((("reduce-scatter: partial sums travel right, one rank "
                                            "added per hop", 0),
                                           ("all-gather: complete chunks travel right, stored as "
                                            "they are", n - 1))):
        y0 = -half * (rows_h + 2.4)
        ax.text(-1.2, y0 + 1.35, f"{'1' if half == 0 else '2'}. {label}", fontsize=11,
                fontweight="bold", ha="left", va="bottom")
        for j in range(n):
            title, holds, sends, _ = states[first + j]
            if half == 0 and j == n - 1:  # reduce-scatter done: each rank's own chunk complete
                title, sends = f"after step {n - 2}", [None] * n
            x0 = j * col
            ax.text(x0 + n * size / 2, y0 + 0.5, title, ha="center", va="bottom", fontsize=10)
            for c in range(n):
                ax.text(x0 + (c + 0.5) * size, y0 + 0.02, str(c), ha="center", va="bottom",
                        fontsize=9, color="#555555")
            panel(ax, x0, y0, holds, sends, n, size, gap)
        for r in range(n):
            ax.text(-0.25, y0 - r * (size + gap) - size / 2, f"rank {r}", ha="right",
                    va="center", fontsize=10)
    # The legend: shades and the outline.
    ly = -2 * (rows_h + 2.4) + 1.6
    for k in range(1, n + 1):
        ax.add_patch(mpatches.Rectangle((k * 0.9 - 0.9, ly - 0.6), 0.6, 0.6,
                                        facecolor=shade(k, n), edgecolor="white"))
        ax.text(k * 0.9 - 0.6, ly - 0.3, str(k), ha="center", va="center", fontsize=9,
                color="white" if k > n / 2 else "#1F2D4D")
    ax.text(n * 0.9 + 0.1, ly - 0.3, f"ranks summed into the chunk (chunk numbers above each "
            f"panel; {n} = complete)", fontsize=10, va="center")
    ax.add_patch(mpatches.Rectangle((0, ly - 1.5), 0.6, 0.6, fill=False, edgecolor=figlib.COMM,
                                    linewidth=2.4))
    ax.text(n * 0.9 + 0.1 - (n * 0.9 - 0.7), ly - 1.2, "the chunk the rank sends to rank r+1 in "
            "the next step", fontsize=10, va="center")
    ax.set_xlim(-2.2, (n - 1) * col + n * size + 0.3)
    ax.set_ylim(ly - 1.9, 2.0)
    ax.set_aspect("equal")
    figlib.save(fig, args.out, f"tools/figures/ring.py (a model of lab 03's ring, {n} ranks, "
                f"2(n-1) = {2 * (n - 1)} steps)")


if __name__ == "__main__":
    main()
