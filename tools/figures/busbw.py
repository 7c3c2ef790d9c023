#!/usr/bin/env python3
"""Bus bandwidth against message size (labs 03 and 07), nccl-tests style.

  busbw.py ring DATA.json OUT.svg             lab 03 (`lab03_run --json`): ring, recursive
                                              doubling and the built-in all-reduce
  busbw.py topology OUT.svg DATA.json...      lab 07 (`lab07_run --net PRESET --json`): the
                                              flat ring against the hierarchical all-reduce, one
                                              panel per network

busbw = S / time x 2(n-1)/n: the bandwidth each rank's link sustains, comparable across rank
counts and with a datasheet. Measurements: the machine is printed under the figure.
"""

import argparse

import figlib
from figlib import plt

STYLE = {"ring": ("o", figlib.RANKS[0]), "recursive doubling": ("s", figlib.RANKS[1]),
         "built-in": ("^", figlib.RANKS[2])}


def size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ticks = [s for s in sizes]
    # Every other size labelled: the labels stay legible at the site's width.
    ax.set_xticks(ticks, [figlib.human_bytes(s).replace(" ", "\u2009") if i % 2 == 0 else ""
                          for i, s in enumerate(ticks)], rotation=0, fontsize=figlib.SMALL)
    ax.minorticks_off()
    ax.set_xlabel("message size")


def ring(args):
    d = figlib.load(args.data)
    n, factor = d["ranks"], d["bus_factor"]
    fig, (bw, tm) = plt.subplots(1, 2, figsize=(figlib.WIDTH, 3.4))
    sizes = []
    for a in d["algorithms"]:
        pts = a["points"]
        if not pts:
            continue
        marker, colour = STYLE.get(a["name"], ("o", None))
        x = [b for b, _ in pts]
        sizes = x if len(x) > len(sizes) else sizes
        bw.plot(x, [b / t * factor / 1e9 for b, t in pts], marker=marker, color=colour,
                label=a["title"], linewidth=1.4, markersize=4)
        tm.plot(x, [t * 1e6 for _, t in pts], marker=marker, color=colour, label=a["title"],
                linewidth=1.4, markersize=4)
    size_axis(bw, sizes)
    size_axis(tm, sizes)
    bw.set_ylabel("busbw (GB/s)")
    bw.set_ylim(bottom=0)
    bw.set_title(f"bus bandwidth, {n} ranks", loc="left")
    tm.set_yscale("log")
    tm.set_ylabel("time per all-reduce (µs)\nmedian of the slowest rank")
    tm.set_title("time: alpha (left), then bytes (beta)", loc="left")
    bw.legend(frameon=False)
    fig.suptitle(f"All-reduce of {d['dtype']} ({d['op']}), {n} ranks over {d['backend']}",
                 x=0.0, ha="left", fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source or f"./lab run 03 -n {n} -- --json FILE",
                measured=figlib.machine(n),
                quoted={k: d[k] for k in ("ranks", "backend", "dtype", "op", "bus_factor",
                                          "wrong", "algorithms")})


def topology(args):
    runs = [figlib.load(p) for p in args.data]
    fig, axes = plt.subplots(1, len(runs), figsize=(figlib.WIDTH, 3.6), squeeze=False,
                             sharey=False)
    for ax, d in zip(axes[0], runs):
        rows = d["rows"]
        x = [r["bytes"] for r in rows]
        ax.plot(x, [r["flat_busbw"] / 1e9 for r in rows], marker="o", color=figlib.RANKS[0],
                label="flat ring\n(Comm::all_reduce)", linewidth=1.4, markersize=4)
        if all("hierarchical_busbw" in r for r in rows):
            ax.plot(x, [r["hierarchical_busbw"] / 1e9 for r in rows], marker="s",
                    color=figlib.RANKS[1], label="hierarchical (lab 07)", linewidth=1.4,
                    markersize=4)
        size_axis(ax, x)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("busbw (GB/s, in the hardware's time)" if ax is axes[0][0] else "")
        net = d["network"].split(":")[0] if d["network"] else "no emulated network"
        ax.set_title(f"{net}\n{d['nodes']} nodes x {d['ranks_per_node']} ranks", loc="left")
        ax.legend(frameon=False)
    fig.suptitle("Flat ring vs hierarchical all-reduce, emulated two-node cluster", x=0.0,
                 ha="left", fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout()
    n = runs[0]["ranks"]
    figlib.save(fig, args.out,
                args.source or f"./lab run 07 -n {n} --net PRESET -- --json FILE "
                "(emulated links; bandwidths scaled back by the preset's time_scale)",
                measured=figlib.machine(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("ring")
    r.add_argument("data")
    r.add_argument("out")
    r.add_argument("--source")
    t = sub.add_parser("topology")
    t.add_argument("out")
    t.add_argument("data", nargs="+")
    t.add_argument("--source")
    args = ap.parse_args()
    {"ring": ring, "topology": topology}[args.cmd](args)


if __name__ == "__main__":
    main()
