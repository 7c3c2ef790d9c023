"""What every figure script shares: one look, deterministic SVG, the machine label, legibility.

A figure of a model (a schedule, a layout, a formula) must come out byte-identical on every
run and every machine, so that `./lab figures` leaves it unchanged in git: fixed element ids
(svg.hashsalt), no date, text kept as text. A figure of a measurement says how and where it was
measured: `machine()` names the CPU, its cores, the ranks, the runs it is the median of and the
date (make_figures.py passes them in DTL_FIGURE_MEASUREMENT), and `save(..., measured=...)`
prints it under the figure, with "drawn under load X on N cores" when it was drawn on a busy
machine (make_figures.py --allow-load).

Legible on the site: the site shows a figure at most 688 px wide (scaled down to it, never up),
so `save` refuses a figure with any text under 9 px as rendered there (figdata.legibility: the
size in pt x 688 / the figure's width in pt, or x 4/3 when narrower). Figures are drawn about
WIDTH inches wide, so that their pt sizes are close to the px the reader sees.
"""

import argparse
import io
import json
import os
import platform
import re
import sys
import textwrap

import figdata

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402 (after use())

plt.rcParams.update({
    "svg.hashsalt": "dtl",        # element ids from a fixed salt: the same SVG on every run
    "svg.fonttype": "none",       # text stays text: small files, searchable, crisp at any zoom
    "font.family": ["DejaVu Sans", "sans-serif"],  # and a generic fallback in the SVG (save)
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "legend.fontsize": 7.5,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.08,
})

# One colour per rank (the first ten), and the meaning of the others across all figures.
RANKS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
         "#8C8C8C", "#CCB974", "#64B5CD"]
FORWARD, BACKWARD, COMM, IDLE = "#4C72B0", "#55A868", "#DD8452", "#E8E8E8"
PARAMS, GRADS, OPTIMIZER, ACTIVATIONS = "#4C72B0", "#DD8452", "#55A868", "#C44E52"


WIDTH = 7.2        # inches: about the site's 688 px column, so a pt is about a px there
SMALL = 7.0        # the smallest font size a figure uses (pt): 9 px at up to 7.6 in wide
SUPTITLE = 10.5    # a figure's own title


def rank_colour(r):
    return RANKS[r % len(RANKS)]


def load(path):
    with open(path) as f:
        return json.load(f)


def measurement():
    """How the data was measured, from make_figures.py (DTL_FIGURE_MEASUREMENT, JSON: how, date,
    cpu, loaded); {} when a script is run by hand."""
    try:
        return json.loads(os.environ.get("DTL_FIGURE_MEASUREMENT", "")) or {}
    except ValueError:
        return {}


def machine(ranks=None):
    """'median of 5 runs, point by point; Intel Xeon ... (2 cores), Linux, 4 ranks, 2026-11-30':
    how and where a measurement was taken."""
    m = measurement()
    cores = os.cpu_count() or 0
    out = f"{m.get('how', '1 run')}; {m.get('cpu') or figdata.cpu()} ({cores} core" \
          f"{'s' if cores != 1 else ''}), {platform.system()}"
    if ranks:
        out += f", {ranks} rank{'s' if ranks != 1 else ''}"
    if m.get("date"):
        out += f", {m['date']}"
    else:  # drawn by hand: at least what else the machine was doing
        try:
            out += f", load average {os.getloadavg()[0]:.1f} when drawn"
        except OSError:
            pass
    if m.get("loaded"):
        out += f"; {m['loaded']}"
    return out


def how():
    """The phrase of the quoted numbers: 'median of 5 runs (...)' (or '1 run')."""
    return measurement().get("how", "1 run")


FONT_FALLBACK = {"'DejaVu Sans'": "'DejaVu Sans', sans-serif",
                 "'DejaVu Sans Mono'": "'DejaVu Sans Mono', monospace"}


def font_fallback(svg):
    """Every text's family as the named font then a generic one, "'DejaVu Sans', sans-serif": a
    reader without DejaVu gets a sans-serif, not a serif. (matplotlib writes the first family
    alone, or expands the generic into rcParams' whole list of candidates.)"""
    svg = re.sub(r"('DejaVu Sans(?: Mono)?')(?:, '[^']*')*, (?:sans-serif|monospace)",
                 lambda m: FONT_FALLBACK[m.group(1)], svg)
    return re.sub(r"'DejaVu Sans(?: Mono)?'(?!,)", lambda m: FONT_FALLBACK[m.group(0)], svg)


def footnote_size(fig, pad):
    """The footnote's size (pt): the smallest legible one for the figure's width."""
    box = fig.get_tightbbox()
    width_pt = (box.width + 2 * pad) * 72
    return max(SMALL, figdata.MIN_PX / figdata.rendered_scale(width_pt) + 0.15), width_pt


def save(fig, path, source, measured=None, quoted=None):
    """Writes `fig` to `path` (SVG) with a footnote: the command that made the data, and for a
    measurement how and where (measured = the label, e.g. machine(4)). `quoted`: the numbers
    the notes quote beside the figure (figdata.RENDER), kept inside the SVG. Refuses (exits)
    when any text would render under figdata.MIN_PX px on the site."""
    note = f"data: {source}"
    if measured:
        note += f"\nmeasured: {measured}"
    pad = plt.rcParams["savefig.pad_inches"]
    size, width_pt = footnote_size(fig, pad)
    chars = max(40, int(width_pt / (0.55 * size)))  # DejaVu Sans: ~0.55 em per character
    note = "\n".join(textwrap.fill(line, chars, subsequent_indent="  ")
                     for line in note.split("\n"))
    # Under everything drawn so far (legends below the axes included).
    box = fig.get_tightbbox()
    fig.text(box.x0 / fig.get_figwidth(), box.y0 / fig.get_figheight() - 0.015, note,
             fontsize=size, color="#555555", ha="left", va="top", transform=fig.transFigure)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "dtl ./lab figures"})
    if os.environ.get("DTL_FIGURE_PNG"):  # a raster beside it, to look at while drawing
        fig.savefig(os.path.splitext(str(path))[0] + ".png", format="png", dpi=96)
    plt.close(fig)
    svg = font_fallback(buf.getvalue())
    width, smallest, small = figdata.legibility(svg)
    if small:
        lines = "\n  ".join(f"{px:.1f} px: {t[:70]}" for px, t in small[:12])
        sys.exit(f"figlib: {path}: text under {figdata.MIN_PX:g} px on the site ({width:.0f} pt "
                 f"wide, shown at most {figdata.SITE_WIDTH_PX} px): make it larger or the "
                 f"figure narrower:\n  {lines}")
    if quoted is not None:
        svg = figdata.embed(svg, dict(quoted, how=how()))
    with open(path, "w") as f:
        f.write(svg)


def mib(x):
    return x / 2**20


def short_model(text):
    """'GPTConfig(vocab_size=256 ... n_layer=4 ...)' -> '4 layers, d 64, 4 heads, vocab 256'."""
    kv = dict(re.findall(r"(\w+)=([^\s,)]+)", text))
    if "n_layer" not in kv:
        return text
    return (f"GPT: {kv['n_layer']} layers, d {kv.get('d_model', '?')}, "
            f"{kv.get('n_head', '?')} heads, vocab {kv.get('vocab_size', '?')}, "
            f"T {kv.get('seq_len', '?')}")


def human_bytes(b):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            v = b / scale
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{b:.0f} B"


def cli(doc, commands):
    """main() of a script of several figures, each `NAME DATA.json OUT.svg [--source S]`:
    parses the command line and calls commands[NAME](args)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in commands:
        p = sub.add_parser(name)
        p.add_argument("data")
        p.add_argument("out")
        p.add_argument("--source", help="the command that made the data (printed under the figure)")
    args = ap.parse_args()
    commands[args.cmd](args)
