"""What every figure script shares: one look, deterministic SVG, the machine label.

A figure of a model (a schedule, a layout, a formula) must come out byte-identical on every
run and every machine, so that `./lab figures` leaves it unchanged in git: fixed element ids
(svg.hashsalt), no date, text kept as text. A figure of a measurement says where it was
measured: `machine()` names the CPU, its cores and the ranks, and `save(..., measured=...)`
prints it under the figure.
"""

import argparse
import json
import os
import platform
import re

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402 (after use())

plt.rcParams.update({
    "svg.hashsalt": "dtl",        # element ids from a fixed salt: the same SVG on every run
    "svg.fonttype": "none",       # text stays text: small files, searchable, crisp at any zoom
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
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


def rank_colour(r):
    return RANKS[r % len(RANKS)]


def load(path):
    with open(path) as f:
        return json.load(f)


def machine(ranks=None):
    """'Intel Xeon ... (2 cores), Linux, 4 ranks, load average 1.2 when drawn': where a
    measurement was taken."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            if m:
                cpu = re.sub(r"\s+", " ", m.group(1)).strip()
    except OSError:
        pass
    cores = os.cpu_count() or 0
    out = f"{cpu} ({cores} core{'s' if cores != 1 else ''}), {platform.system()}"
    if ranks:
        out += f", {ranks} rank{'s' if ranks != 1 else ''}"
    try:  # what else the machine was doing: a loaded machine stretches every timing
        out += f", load average {os.getloadavg()[0]:.1f} when drawn"
    except OSError:
        pass
    return out


def save(fig, path, source, measured=None):
    """Writes `fig` to `path` (SVG) with a footnote: the command that made the data, and for a
    measurement the machine (measured = the label, e.g. machine(4))."""
    note = f"data: {source}"
    if measured:
        note += f"\nmeasured on {measured}"
    # Under everything drawn so far (legends below the axes included).
    box = fig.get_tightbbox()
    fig.text(box.x0 / fig.get_figwidth(), box.y0 / fig.get_figheight() - 0.015, note,
             fontsize=7, color="#555555", ha="left", va="top", transform=fig.transFigure)
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": "dtl ./lab figures"})
    plt.close(fig)


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
