"""The numbers beside the figures, and the checks that need no matplotlib (standard library only).

A measured figure carries the few numbers the notes quote beside it inside its own SVG (a
<desc id="dtl-figure-data"> element holding JSON, written by figlib.save). From them this module
renders the Markdown that stands between generated markers in the notes and handouts:

  <!-- figure-data 03-busbw begin -->
  ... generated: ./lab figures rewrites it, never edit by hand ...
  <!-- figure-data 03-busbw end -->

so that the quoted numbers and the drawn ones are the same measurement. `check(root)` compares
every block with what the committed SVG gives (tools/site/build_site.py runs it before every
site build, `make_figures.py --check-quoted` runs it by hand); `update(root)` rewrites them.

Also here: the legibility rule (every text at least MIN_PX pixels as the site renders the
figure) read back from the SVG, and the medians over repeated runs of a demo (make_figures.py).
"""

import html
import json
import math
import platform
import re
import statistics
from pathlib import Path

# ---------------------------------------------------------------- legibility

SITE_WIDTH_PX = 688  # the site's content column: a figure is scaled down to it, never up
MIN_PX = 9.0         # the smallest text, in CSS pixels as rendered there (body text: 16)


def cpu():
    """This machine's CPU model, as /proc/cpuinfo names it (else the architecture)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            if m:
                name = re.sub(r"\s+", " ", m.group(1)).strip()
    except OSError:
        pass
    return name


def svg_size_pt(svg):
    m = re.search(r'<svg[^>]*\bwidth="([\d.]+)pt"[^>]*\bheight="([\d.]+)pt"', svg)
    if not m:
        raise ValueError("not a matplotlib SVG (no width/height in pt)")
    return float(m.group(1)), float(m.group(2))


def rendered_scale(width_pt):
    """CSS px per pt of a figure `width_pt` wide on the site: 688 / width, or 4/3 (1 pt = 4/3
    px) when the figure is narrower than the column (an <img> is not enlarged past its own
    size)."""
    return min(SITE_WIDTH_PX / width_pt, 4.0 / 3.0)


TEXT = re.compile(r"<text\b[^>]*?style=\"[^\"]*?font:\s*(?:[a-z0-9 ]*?\s)?([\d.]+)px[^\"]*\"[^>]*>"
                  r"(.*?)</text>", re.S)


def text_sizes(svg):
    """[(size in pt, text)] of every text of a matplotlib SVG written with svg.fonttype none."""
    out = []
    for m in TEXT.finditer(svg):
        words = html.unescape(re.sub(r"<[^>]+>", "", m.group(2))).strip()
        if words:
            out.append((float(m.group(1)), words))
    return out


def legibility(svg):
    """(width in pt, smallest rendered px, [(px, text)] below MIN_PX) of an SVG."""
    width, _ = svg_size_pt(svg)
    scale = rendered_scale(width)
    sizes = [(pt * scale, t) for pt, t in text_sizes(svg)]
    smallest = min((px for px, _ in sizes), default=float("inf"))
    return width, smallest, sorted((px, t) for px, t in sizes if px < MIN_PX - 1e-6)


# ---------------------------------------------------------------- data inside the SVG

DESC = re.compile(r'<desc id="dtl-figure-data">(.*?)</desc>', re.S)


def embed(svg, data):
    """The SVG with `data` (JSON) in a <desc> right after the root element's start tag."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    desc = f'\n <desc id="dtl-figure-data">{html.escape(text, quote=False)}</desc>'
    svg = DESC.sub("", svg)
    end = re.search(r"<svg\b[^>]*>", svg).end()
    return svg[:end] + desc + svg[end:]


def extract(svg):
    m = DESC.search(svg)
    return json.loads(html.unescape(m.group(1))) if m else None


# ---------------------------------------------------------------- timelines (trace summaries)


def trace_events(trace, rank=None):
    """(rank, is_comm, start s, end s, name) of a Chrome trace's complete events."""
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = []
    for e in raw:
        if e.get("ph") != "X" or (rank is not None and e["pid"] != rank):
            continue
        if e["name"].startswith("barrier"):
            continue
        s = e["ts"] / 1e6
        out.append((e["pid"], e.get("cat") == "comm", s, s + e.get("dur", 0) / 1e6, e["name"]))
    return out


def union(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, -math.inf
    for s, t in sorted(intervals):
        if t <= end:
            continue
        total += t - max(s, end)
        end = t
    return total


def clip(intervals, lo, hi):
    return [(max(s, lo), min(t, hi)) for s, t in intervals if t > lo and s < hi]


def busy(events, lo, hi):
    """{step, compute, comm, exposed} in seconds of rank-filtered `events` within [lo, hi]:
    exposed = communication time with no compute under it."""
    comp = clip([(s, t) for _, c, s, t, _ in events if not c], lo, hi)
    comm = clip([(s, t) for _, c, s, t, _ in events if c], lo, hi)
    both = union(comp) + union(comm) - union(comp + comm)
    return {"step": hi - lo, "compute": union(comp), "comm": union(comm),
            "exposed": union(comm) - both}


def forward_windows(events):
    """[(lo, hi)] from each start of a 'forward' on rank 0 to the next (the last to the end)."""
    starts = sorted(s for r, _, s, _, n in events if r == 0 and n == "forward")
    end = max(t for _, _, _, t, _ in events)
    return [(a, b) for a, b in zip(starts, starts[1:] + [end])]


def ddp_steps(trace, steps):
    """(naive window, DDP window) of lab 04's trace: the last step of each (timeline.py ddp)."""
    w = forward_windows(trace_events(trace))
    return w[steps - 1], w[2 * steps - 1]


def span(trace):
    ev = trace_events(trace)
    return max(t for _, _, _, t, _ in ev) - min(s for _, _, s, _, _ in ev)


# ---------------------------------------------------------------- medians of repeated runs


def median_merge(docs):
    """One document from K of the same shape: the median of every number, elementwise in lists
    of equal length, the first run's value for anything else."""
    first = docs[0]
    if isinstance(first, bool) or first is None or isinstance(first, str):
        return first
    if isinstance(first, (int, float)):
        vals = [d for d in docs if isinstance(d, (int, float))]
        m = statistics.median(vals)
        return int(m) if isinstance(first, int) and m == int(m) else m
    if isinstance(first, list):
        if all(isinstance(d, list) and len(d) == len(first) for d in docs):
            return [median_merge([d[i] for d in docs]) for i in range(len(first))]
        return first
    if isinstance(first, dict):
        return {k: median_merge([d[k] for d in docs if k in d]) for k in first}
    return first


def median_index(values):
    """Index of the median value (the lower median for an even count: always a real run)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def median_run(docs, key):
    """The run whose key(doc) is the median: timelines are not averaged, a real run is drawn."""
    return docs[median_index([key(d) for d in docs])]


def step_seconds(samples):
    return samples[-1][0] - samples[0][0] if samples else 0.0


def combine(lab, docs, steps=None):
    """The document the figure is drawn from, out of the K runs of lab `lab` (each a parsed
    JSON file), and a line that says how: per-point medians for sweeps (lab 03, 07), the run
    of median step time for timelines (per schedule, policy or case where there are several)."""
    k = len(docs)
    if k == 1:
        return docs[0], "1 run"
    if lab in ("03", "07"):
        return median_merge(docs), f"median of {k} runs, point by point"
    if lab == "04":
        def total(d):
            a, b = ddp_steps(d, steps)
            return (a[1] - a[0]) + (b[1] - b[0])
        return median_run(docs, total), f"median of {k} runs: the run of median step time"
    if lab == "06":
        return median_run(docs, lambda d: step_seconds(d["samples"])), \
            f"median of {k} runs: the run of median duration"
    if lab == "12":
        out = dict(docs[0])
        out["schedules"] = [median_run([d["schedules"][i] for d in docs],
                                       lambda s: s["measured"]["step_ms"])
                            for i in range(len(docs[0]["schedules"]))]
        return out, f"median of {k} runs: per schedule, the run of median step time"
    if lab == "13":
        out = dict(docs[0])
        out["policies"] = [median_run([d["policies"][i] for d in docs],
                                      lambda p: step_seconds(p["samples"]))
                           for i in range(len(docs[0]["policies"]))]
        return out, f"median of {k} runs: per policy, the run of median step time"
    if lab == "16":
        out = dict(docs[0])
        if "matmul" in out:
            out["matmul"] = dict(out["matmul"])
            for mode in ("plain", "ring"):
                out["matmul"][mode] = median_run([d["matmul"][mode] for d in docs], span)
        if "fsdp" in out:
            out["fsdp"] = dict(out["fsdp"])
            for case in ("no_prefetch", "prefetch"):
                if out["fsdp"].get(case):
                    out["fsdp"][case] = median_run([d["fsdp"][case] for d in docs],
                                                   lambda c: span(c["trace"]))
        return out, f"median of {k} runs: per case, the run of median step time"
    return docs[0], f"the first of {k} runs"


# ---------------------------------------------------------------- the quoted numbers


def _ms(s):
    return f"{s * 1e3:.0f} ms" if s >= 0.1 else f"{s * 1e3:.1f} ms"


def _bytes(b):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.0f} {unit}" if b / scale >= 10 else f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def _mib(b):
    return f"{b / 2**20:.2f}"


def _busy_table(rows, first):
    """rows: [(label, {step, compute, comm, exposed})] -> Markdown table."""
    out = [f"| {first} | step | compute | comm | exposed | exposed / comm |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, b in rows:
        share = f"{100 * b['exposed'] / b['comm']:.0f}%" if b["comm"] > 0 else "-"
        out.append(f"| {label} | {_ms(b['step'])} | {_ms(b['compute'])} | {_ms(b['comm'])} | "
                   f"{_ms(b['exposed'])} | {share} |")
    return out


def render_busbw(d):
    n, factor = d["ranks"], d["bus_factor"]
    algos = [a for a in d["algorithms"] if a["points"]]
    lines = ["```",
             f"# lab 03 all-reduce: {n} ranks, {d['backend']} backend, {d['dtype']} {d['op']}; "
             f"{d['how']} (./lab figures 03)",
             f"# time: median over iterations of the slowest rank; busbw = algbw x 2(n-1)/n = "
             f"algbw x {factor:.3f}",
             "#",
             "# " + " " * 10 + "".join(f" {a['name']:^25}" for a in algos),
             "# " + f"{'size':>10}" + "".join(f" {'time':>9} {'algbw':>7} {'busbw':>7}"
                                              for _ in algos),
             "# " + f"{'(B)':>10}" + "".join(f" {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}"
                                             for _ in algos)]
    sizes = [b for b, _ in algos[0]["points"]]
    for i, size in enumerate(sizes):
        row = f"  {size:>10.0f}"
        for a in algos:
            b, t = a["points"][i]
            algbw = b / t / 1e9
            row += f" {t * 1e6:>9.1f} {algbw:>7.3f} {algbw * factor:>7.3f}"
        lines.append(row)
    lines.append(f"# Wrong elements: {d['wrong']} {'OK' if d['wrong'] == 0 else 'FAILED'}")
    lines.append("# Avg bus bandwidth (GB/s): " + "  ".join(
        f"{a['name']} {statistics.fmean(b / t * factor for b, t in a['points']) / 1e9:.3f}"
        for a in algos))
    ring = next((a for a in algos if a["name"] == "ring"), None)
    if ring and n > 1 and len(ring["points"]) >= 2:
        (s1, t1), (s2, t2) = ring["points"][0], ring["points"][-1]
        if t2 > t1:
            slope = (t2 - t1) / (s2 - s1)
            alpha = max(t1 - slope * s1, 0.0) / (2 * (n - 1))
            beta = 2 * (n - 1) / n / slope
            lines.append(f"# alpha-beta fit of the ring (smallest and largest size): alpha = "
                         f"{alpha * 1e6:.1f} us per step, beta = {beta / 1e9:.2f} GB/s")
            # Where recursive doubling stops winning, in the course's alpha-beta model
            # (solutions/03's alpha_beta_time): ring 2(n-1)(a + S/n/b), recursive doubling
            # rounds x (a + S/b), two more rounds when n is not a power of two.
            lg = n.bit_length() - 1
            rounds = lg if 1 << lg == n else lg + 2
            size, cross = 64.0, None
            while size <= 1e10:
                if 2 * (n - 1) * (alpha + size / n / beta) < rounds * (alpha + size / beta):
                    cross = size
                    break
                size *= 1.05
            lines.append(f"# model: recursive doubling is faster below ~{_bytes(cross)}, the "
                         "ring above" if cross else
                         "# model: recursive doubling is never slower at these sizes")
    lines.append("```")
    return lines


def render_ddp(d):
    return ([f"Drawn in the figure (rank 0, the last step of each; {d['how']}):", ""]
            + _busy_table([("naive", d["naive"]), ("DDP", d["ddp"])], "variant"))


def render_schedules(d):
    lines = ["| schedule | formula | simulated | measured | simulated step | measured step | "
             "peak in flight |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in d["schedules"]:
        peak = s["peak"]
        peak_text = (f"{peak} chunks ({peak / s['v']:g} stages)" if s["v"] > 1 else str(peak))
        lines.append(f"| {s['title']} | {s['formula']:.4f} | {s['simulated']:.4f} | "
                     f"{s['measured']:.4f} | {s['simulated_ms']:.0f} ms | "
                     f"{s['measured_ms']:.0f} ms | {peak_text} |")
    return lines + ["", f"(`./lab run 12 -n {d['p']}`, m = {d['m']}, as drawn in the figure "
                        f"below; {d['how']}.)"]


def render_recompute(d):
    lines = ["| policy | kept: formula | kept: tracker | peak: formula | peak: tracker | step | "
             "extra / forward |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    none = next((p for p in d["policies"] if p["name"] == "none"), d["policies"][0])
    for p in d["policies"]:
        extra = (p["step"] - none["step"]) / none["forward"] if none["forward"] > 0 else 0
        lines.append(f"| {p['name']} | {_mib(p['predicted_kept'])} | {_mib(p['kept'])} | "
                     f"{_mib(p['predicted_peak'])} | {_mib(p['peak'])} | {_ms(p['step'])} | "
                     f"{extra:.2f} |")
    return lines + ["", "(MiB; the traced step of `./lab run 13 -- --iters 2 --json FILE`, as "
                        "drawn in the figure; extra / forward: the step's time beyond no "
                        f"checkpointing's, in forwards; {d['how']}.)"]


def render_fsdp(d):
    return ([f"Drawn in the figure (rank 0, the fastest step of each case; {d['how']}):", ""]
            + _busy_table([(c["title"], c) for c in d["cases"]], "case"))


def render_matmul(d):
    rows = [(m["title"], m) for m in d["modes"]]
    lines = ([f"Drawn in the figure (rank 0, the fastest call of each mode; {d['how']}):", ""]
             + _busy_table(rows, "mode"))
    if len(rows) == 2 and rows[0][1]["step"] > 0:
        lines += ["", f"ring / plain: {rows[1][1]['step'] / rows[0][1]['step']:.2f}"]
    return lines


RENDER = {"03-busbw": render_busbw, "04-ddp-timeline": render_ddp,
          "12-schedules-measured": render_schedules, "13-memory-recompute": render_recompute,
          "15-fsdp-timeline": render_fsdp, "16-collective-matmul": render_matmul}


def render(name, data):
    """The block's Markdown, blank lines around it (a raw-HTML comment line before a table or a
    code fence must not swallow it)."""
    return "\n" + "\n".join(RENDER[name](data)) + "\n\n"


# ---------------------------------------------------------------- the Markdown blocks

# The body: every line between the markers (each with its newline), possibly none.
BLOCK = re.compile(r"(<!-- figure-data (?P<name>[\w.-]+) begin -->\n)(?P<body>(?:.*?\n)??)"
                   r"(<!-- figure-data (?P=name) end -->)", re.S)


def markdown_files(root):
    root = Path(root)
    return sorted(list((root / "notes").glob("*.md")) + list((root / "labs").glob("*/README.md")))


def blocks(root):
    """[(path, name, body)] of every generated block."""
    out = []
    for path in markdown_files(root):
        for m in BLOCK.finditer(path.read_text()):
            out.append((path, m.group("name"), m.group("body")))
    return out


def figure_data(root, name, figures=None):
    svg = Path(figures or Path(root) / "notes" / "figures") / f"{name}.svg"
    return extract(svg.read_text()) if svg.is_file() else None


def check(root):
    """(problems, pending): a block that differs from what its figure's data gives, or names a
    figure that does not exist or renders nothing, is a problem; a block whose figure was drawn
    before figures carried their numbers is pending (redraw it)."""
    problems, pending = [], []
    root = Path(root)
    for path, name, body in blocks(root):
        rel = path.relative_to(root)
        if name not in RENDER:
            problems.append(f"{rel}: figure-data block for '{name}', which has no generated "
                            f"numbers (known: {', '.join(RENDER)})")
            continue
        if not (root / "notes" / "figures" / f"{name}.svg").is_file():
            problems.append(f"{rel}: figure-data block for notes/figures/{name}.svg, which does "
                            "not exist")
            continue
        data = figure_data(root, name)
        if data is None:
            pending.append(f"{rel}: {name}: the figure carries no numbers yet (drawn before "
                           "make_figures.py wrote them): redraw it")
            continue
        want = render(name, data)
        if body != want:
            problems.append(f"{rel}: the numbers between the figure-data {name} markers differ "
                            f"from notes/figures/{name}.svg's (./lab figures rewrites them; "
                            "do not edit by hand)")
    return problems, pending


def update(root, names=None, figures=None):
    """Rewrites the blocks of the figures `names` (all with data when None) from their SVGs (in
    `figures`, default notes/figures). Returns the files changed."""
    root = Path(root)
    changed = []
    for path in markdown_files(root):
        text = path.read_text()

        def fill(m):
            name = m.group("name")
            if name not in RENDER or (names is not None and name not in names):
                return m.group(0)
            data = figure_data(root, name, figures)
            if data is None:
                return m.group(0)
            return m.group(1) + render(name, data) + m.group(4)

        new = BLOCK.sub(fill, text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
