#!/usr/bin/env python3
"""Who holds which slice: tensor- and sequence-parallel layouts (labs 08, 09, 10).

  layouts.py mlp DATA.json OUT.svg        lab 08 (`lab08_run --json`): the MLP's column- and
                                          row-parallel weights, from the shapes rank 0 holds
                                          against the serial ones
  layouts.py block DATA.json OUT.svg      lab 09 (`lab09_run --json`): every weight of a block
                                          and the embedding, split or replicated, and where the
                                          all-reduces sit
  layouts.py sequence DATA.json OUT.svg   lab 10 (`lab10_run --json`): the residual stream of a
                                          sequence-parallel block, each rank's positions
  layouts.py ring DATA.json OUT.svg       lab 10: ring attention's causal blocks by ring step,
                                          and the measured peak memory against full attention

A weight split over t ranks is drawn in t bands, one colour per rank, along the dimension that
differs from the serial weight; grey hatching is a tensor every rank holds whole. The layout
figures are models (the same on every machine); the memory panel of `ring` is measured.
"""

import matplotlib.patches as mpatches
from matplotlib.ticker import FuncFormatter

import figlib
from figlib import plt

WHOLE = "#D9D9D9"


def shapes(entries):
    return {name: shape for name, shape in entries}


def split_of(serial, shard):
    """(dim, parts) of a shard against its serial shape: dim None when the same."""
    for dim, (a, b) in enumerate(zip(serial, shard)):
        if a != b:
            return dim, a // b
    return None, 1


def matrix(ax, x, y, w, h, split_dim, parts, label="", sub="", bands=None, band_size=None):
    """A weight or activation of w x h drawn at (x, y) (top-left), split into `parts` bands along
    rows (dim 0: horizontal bands) or columns (dim 1: vertical bands); None: held whole."""
    if split_dim is None or parts <= 1:
        ax.add_patch(mpatches.Rectangle((x, y - h), w, h, facecolor=WHOLE, edgecolor="#555555",
                                        hatch="////", linewidth=0.8))
    else:
        for k in range(parts):
            if split_dim == 0:
                rect = (x, y - (k + 1) * h / parts, w, h / parts)
            else:
                rect = (x + k * w / parts, y - h, w / parts, h)
            ax.add_patch(mpatches.Rectangle(rect[:2], rect[2], rect[3],
                                            facecolor=figlib.rank_colour(k), edgecolor="white",
                                            linewidth=0.8))
            if bands:
                ax.text(rect[0] + rect[2] / 2, rect[1] + rect[3] / 2, bands[k], ha="center",
                        va="center", fontsize=band_size or figlib.SMALL, color="white",
                        rotation=90 if split_dim == 1 and rect[2] < 14 else 0)
        ax.add_patch(mpatches.Rectangle((x, y - h), w, h, fill=False, edgecolor="#333333",
                                        linewidth=0.8))
    if label:
        ax.text(x + w / 2, y + 3, label, ha="center", va="bottom", fontsize=figlib.SMALL)
    if sub:
        ax.text(x + w / 2, y - h - 3, sub, ha="center", va="top", fontsize=figlib.SMALL,
                color="#333333")


def arrow(ax, x0, x1, y, text="", colour="#333333"):
    ax.annotate("", xy=(x1, y), xytext=(x0, y),
                arrowprops={"arrowstyle": "->", "color": colour, "linewidth": 1.0})
    if text:
        ax.text((x0 + x1) / 2, y + 1.5, text, ha="center", va="bottom", fontsize=figlib.SMALL,
                color=colour)


def rank_legend(fig, t, whole="held whole by every rank"):
    handles = [mpatches.Patch(color=figlib.rank_colour(r), label=f"rank {r}") for r in range(t)]
    handles.append(mpatches.Patch(facecolor=WHOLE, edgecolor="#555555", hatch="////",
                                  label=whole))
    fig.legend(handles=handles, loc="upper center", ncol=t + 1, frameon=False,
               bbox_to_anchor=(0.5, 0.02), handlelength=1.2, columnspacing=1.0)


def canvas(w, h, size):
    fig, ax = plt.subplots(figsize=size)
    ax.set_xlim(0, w)
    ax.set_ylim(-h, 12)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


# ---------------------------------------------------------------- lab 08


def cmd_mlp(args):
    d = figlib.load(args.data)
    t, dm = d["tp"], d["d_model"]
    ser, sh = shapes(d["serial"]), shapes(d["shard"])
    ff = ser["fc.weight"][0]
    s = 60.0 / max(ff, 1)  # drawing units per element (the widest side: 60 units)
    tok, gap = 28, 36
    fc_dim, fc_parts = split_of(ser["fc.weight"], sh["fc.weight"])
    pr_dim, pr_parts = split_of(ser["proj.weight"], sh["proj.weight"])
    fig, ax = canvas(300, 75, (figlib.WIDTH, 2.6))
    x, y = 2, 0
    matrix(ax, x, y, dm * s, tok, None, 1, "X", f"[tokens, {dm}]\nthe same\non every rank")
    x += dm * s
    arrow(ax, x + 2, x + gap - 2, y - tok / 2, "f: identity\n(backward:\nall-reduce)")
    x += gap
    # fc.weight [4d, d] split on its rows = the transpose's columns: each rank its outputs
    matrix(ax, x, y, ff * s, dm * s, None if fc_dim is None else 1 - fc_dim, fc_parts,
           "fc weight\u1d40\n(column parallel)", f"[{dm}, {ff}]: rank r holds\noutput columns r of {t}",
           [f"r{k}" for k in range(fc_parts)])
    x += ff * s
    arrow(ax, x + 2, x + gap - 2, y - tok / 2, "GeLU\n(local)")
    x += gap
    matrix(ax, x, y, ff * s, tok, 1, fc_parts, "Y = GeLU(X W\u2081\u1d40)",
           f"[tokens, {ff}]: each rank its\n{ff // max(fc_parts, 1)} columns, no communication")
    x += ff * s
    arrow(ax, x + 2, x + gap - 2, y - tok / 2, "")
    x += gap
    matrix(ax, x, y, dm * s, ff * s, None if pr_dim is None else 1 - pr_dim, pr_parts,
           "proj weight\u1d40\n(row parallel)", f"[{ff}, {dm}]: rank r\nholds input\nrows r of {t}",
           [f"r{k}" for k in range(pr_parts)])
    x += dm * s
    # (a longer arrow: its label clear of the proj weight's title)
    arrow(ax, x + 2, x + gap + 10, y - tok / 2, "g: all-\nreduce\n(sum of\npartials)")
    x += gap + 12
    matrix(ax, x, y, dm * s, tok, None, 1, "Z", f"[tokens, {dm}]\nthe same\non every rank")
    ax.set_xlim(0, x + dm * s + 4)
    ax.set_ylim(-max(ff * s, tok) - 16, 10)
    rank_legend(fig, t)
    fig.suptitle(f"Tensor-parallel MLP on tp = {t}: column parallel, then row parallel;\n"
                 f"{d['all_reduces']} all-reduces per forward + backward",
                 x=0.0, ha="left", fontsize=figlib.SUPTITLE, fontweight="bold")
    figlib.save(fig, args.out, args.source or f"./lab run 08 -n {t} -- --json FILE "
                "(shapes rank 0 holds against the serial MLP's)")


# ---------------------------------------------------------------- lab 09

# (parameter, title, the all-reduce drawn before (f) or after (g) it)
BLOCK = [("wte.weight", "token\nembedding\n(vocab\nparallel)", ""),
         ("blocks.0.ln1.weight", "LN 1", ""),
         ("blocks.0.attn.qkv.weight", "QKV\n(column\nparallel,\nby heads)", "f"),
         ("blocks.0.attn.proj.weight", "attention\nout (row\nparallel)", "g"),
         ("blocks.0.ln2.weight", "LN 2", ""),
         ("blocks.0.mlp.fc.weight", "MLP fc\n(column\nparallel)", "f"),
         ("blocks.0.mlp.proj.weight", "MLP proj\n(row parallel)", "g")]


def comm_line(ax, x, top, bottom, which):
    ax.plot([x, x], [top, bottom], color="#C44E52", linewidth=0.9, linestyle=":")
    ax.text(x, top + 1, which, ha="center", va="bottom", fontsize=10, fontweight="bold",
            color="#C44E52")


def cmd_block(args):
    d = figlib.load(args.data)
    t, dm, heads, vocab = d["tp"], d["d_model"], d["heads"], d["vocab"]
    ser, sh = shapes(d["serial"]), shapes(d["shard"])
    s = 56.0 / (4 * dm)  # drawing units per element: the MLP's 4d side is 56 units
    fig, ax = canvas(260, 80, (figlib.WIDTH, 3.4))
    x, y, lowest = 2, 0, 0
    for name, title, comm in BLOCK:
        full, part = ser.get(name), sh.get(name)
        if full is None or part is None:
            continue
        dim, parts = split_of(full, part)
        if comm == "f":
            comm_line(ax, x - 6, y + 24, y - 4 * dm * s - 4, "f")
        if len(full) == 1:  # a LayerNorm's gain: a vector of d
            w, h = 2.5, full[0] * s
            matrix(ax, x, y, w, h, dim, parts, title, f"[{full[0]}]")
        elif name.endswith("qkv.weight"):  # [3d, d]: Q, K and V, each split by heads
            w, h = full[1] * s, full[0] * s / 3
            per = heads // max(parts, 1)
            for k, which in enumerate("QKV"):  # each rank: the rows of its heads (colours)
                matrix(ax, x, y - k * (h + 2), w, h, dim, parts, title if k == 0 else "",
                       "" if k < 2 else f"[{full[0]}, {full[1]}]:\nQ, K, V rows\nof each rank's\n"
                       f"{per} heads")
                ax.text(x - 1, y - k * (h + 2) - h / 2, which, ha="right", va="center",
                        fontsize=figlib.SMALL)
            h = 3 * h + 4
        else:
            rows, cols = full
            w, h = cols * s, rows * s
            bands = None
            if name == "wte.weight":
                w, h = cols * s * 2.0, 4 * dm * s
                bands = [f"ids {r * vocab // parts}-{(r + 1) * vocab // parts - 1}"
                         for r in range(parts)]
            sub = f"[{rows}, {cols}]" + ("" if dim is None else
                                         f"\nsplit on\n{'rows' if dim == 0 else 'columns'}")
            matrix(ax, x, y, w, h, dim, parts, title, sub, bands)
        lowest = max(lowest, h)
        if comm == "g":
            comm_line(ax, x + w + 6, y + 24, y - 4 * dm * s - 4, "g")
        x += w + (30 if comm == "g" or name == "wte.weight" else 24)
    ax.set_xlim(-4, x - 16)
    ax.set_ylim(-lowest - 22, 34)
    fig.subplots_adjust(left=0, right=1, top=0.86, bottom=0.02)
    rank_legend(fig, t, "replicated\n(every rank holds it whole)")
    fig.text(0.0, -0.1, "f: identity in forward, all-reduce of its input's gradient in backward."
             "\ng: all-reduce of its output in forward, identity in backward.\n2 all-reduces "
             "per block in forward, 2 in backward; biases split with column-parallel\nweights, "
             "whole with row-parallel ones.", fontsize=figlib.SMALL + 0.5, color="#C44E52",
             va="top", transform=fig.transFigure)
    fig.suptitle(f"Where tensor parallelism lives in a block:\ntp = {t}, {heads} heads, "
                 f"d = {dm}, vocabulary {vocab}", x=0.0, ha="left", fontsize=figlib.SUPTITLE,
                 fontweight="bold", y=1.0)
    figlib.save(fig, args.out, args.source or f"./lab run 09 -n {t * d['dp']} -- --tp {t} "
                "--json FILE (shapes rank 0 holds against the serial GPT's)")


# ---------------------------------------------------------------- lab 10


def cmd_sequence(args):
    d = figlib.load(args.data)
    t, T, dm = d["ranks"], d["seq"], d["d_model"]
    chunks = d["chunks"]
    fig, ax = canvas(250, 80, (figlib.WIDTH, 3.0))
    h = 56.0
    w = 26.0

    def seq_shards(x, label, sub):
        for r, (lo, hi) in enumerate(chunks):
            ax.add_patch(mpatches.Rectangle((x, -h * hi / T), w, h * (hi - lo) / T,
                                            facecolor=figlib.rank_colour(r), edgecolor="white"))
            ax.text(x + w / 2, -h * (lo + hi) / 2 / T, f"{lo}-{hi - 1}", ha="center",
                    va="center", fontsize=figlib.SMALL, color="white")
        ax.add_patch(mpatches.Rectangle((x, -h), w, h, fill=False, edgecolor="#333333"))
        ax.text(x + w / 2, 3, label, ha="center", fontsize=figlib.SMALL + 0.5)
        ax.text(x + w / 2, -h - 3, sub, ha="center", va="top", fontsize=figlib.SMALL)

    x = 2
    gap = 34
    seq_shards(x, "LayerNorm,\ndropout", f"[{T}/{t}, {dm}]\nper rank: its\npositions only")
    arrow(ax, x + w + 1, x + w + gap - 1, -h / 2, "all-gather\n(sequence)")
    x += w + gap
    matrix(ax, x, 0, w, h, None, 1, "full\nsequence", f"[{T}, {dm}]\nfor the column-\nparallel in")
    arrow(ax, x + w + 1, x + w + gap - 1, -h / 2, "column-\nparallel")
    x += w + gap
    matrix(ax, x, 0, w * 1.6, h, 1, t, "attention / MLP", f"[{T}, hidden / {t}]\nheads or\ncolumns per rank")
    arrow(ax, x + w * 1.6 + 1, x + w * 1.6 + gap - 1, -h / 2, "row-parallel,\nreduce-\nscatter")
    x += w * 1.6 + gap
    seq_shards(x, "block\noutput", f"[{T}/{t}, {dm}]\nper rank: back\non the sequence")
    ax.set_xlim(0, x + w + 4)
    ax.set_ylim(-h - 24, 14)
    rank_legend(fig, t, "the same on every rank")
    fig.suptitle(f"Sequence parallelism on tp = {t}:\nthe residual stream of T = {T} positions",
                 x=0.0, ha="left", fontsize=figlib.SUPTITLE, fontweight="bold")
    figlib.save(fig, args.out, args.source or f"./lab run 10 -n {t} -- --json FILE "
                "(each rank's sequence_chunk)")


def cmd_ring(args):
    d = figlib.load(args.data)
    cp = d["ranks"]
    fig, (grid, mem) = plt.subplots(1, 2, figsize=(figlib.WIDTH, 3.9),
                                    gridspec_kw={"width_ratios": [1, 1.1]})
    # Query chunk r (rows) meets key/value chunk (r - i) mod cp at ring step i.
    for r in range(cp):
        for i in range(cp):
            c = (r - i) % cp
            if c > r:
                continue  # the future: masked, skipped
            colour = figlib.RANKS[i % len(figlib.RANKS)]
            if c == r:  # the diagonal block: its causal triangle
                tri = mpatches.Polygon([(c, r), (c, r + 1), (c + 1, r + 1)], closed=True,
                                       facecolor=colour, edgecolor="white")
                grid.add_patch(tri)
            else:
                grid.add_patch(mpatches.Rectangle((c, r), 1, 1, facecolor=colour,
                                                  edgecolor="white"))
            grid.text(c + (0.3 if c == r else 0.5), r + (0.7 if c == r else 0.5),
                      f"step\n{i}" if c == r else f"step {i}", ha="center", va="center",
                      fontsize=figlib.SMALL, color="white")
    grid.set_xlim(0, cp)
    grid.set_ylim(cp, 0)
    grid.set_aspect("equal")
    grid.set_xticks([k + 0.5 for k in range(cp)], [f"K/V {k}" for k in range(cp)])
    grid.set_yticks([k + 0.5 for k in range(cp)],
                    [f"rank {k}: Q {k}\n({k + 1} block{'s' if k else ''})" for k in range(cp)])
    grid.tick_params(length=0)
    for sp in grid.spines.values():
        sp.set_visible(False)
    grid.set_title(f"causal ring attention, cp = {cp}:\nwhich K/V chunk each rank's\n"
                   "queries meet at each ring step", loc="left")
    rows = d["ring_attention"]
    T = [r["T"] for r in rows]
    mem.plot(T, [figlib.mib(r["full_peak"]) for r in rows], marker="o", color=figlib.RANKS[3],
             label="full attention on one rank")
    mem.plot(T, [figlib.mib(r["ring_peak"]) for r in rows], marker="s", color=figlib.RANKS[0],
             label=f"ring attention, per rank (cp = {cp})")
    mem.set_xscale("log", base=2)
    mem.set_yscale("log", base=2)
    mem.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    mem.set_xticks(T, [str(x) for x in T])
    mem.minorticks_off()
    mem.set_xlabel("sequence length T")
    mem.set_ylabel("peak memory, forward + backward (MiB)")
    mem.legend(frameon=False)
    mem.set_title("memory: T\u00b2 whole, (T/cp)\u00b2 + T/cp\nper ring rank (4 heads x 32 dims)",
                  loc="left")
    fig.suptitle("Ring attention (context parallelism)", x=0.0, ha="left",
                 fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    figlib.save(fig, args.out, args.source or f"./lab run 10 -n {cp} -- --json FILE",
                measured=figlib.machine(cp) + " (right panel)")


def main():
    figlib.cli(__doc__, {"mlp": cmd_mlp, "block": cmd_block, "sequence": cmd_sequence, "ring": cmd_ring})


if __name__ == "__main__":
    main()
