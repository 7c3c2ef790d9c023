#!/usr/bin/env python3
"""Memory over a training step, as the tracking allocator saw it (labs 06 and 13).

  memory.py step DATA.json OUT.svg        lab 06 (`lab06_run --json`): two AdamW steps of a fresh
                                          model: activations rise in forward and fall in
                                          backward while gradients appear; the first step
                                          creates the optimizer state
  memory.py recompute DATA.json OUT.svg   lab 13 (`lab13_run --json`): one step under each
                                          checkpointing policy (none, selective, full)

Every allocation and free is a sample (dtl::memory::record_timeline): the bytes are exact, the
time axis is this machine's, printed under the figure.
"""

import figlib
from figlib import plt

PHASES = {"forward": figlib.FORWARD, "backward": figlib.BACKWARD, "optimizer": "#CCB974"}
POLICY = {"none": figlib.RANKS[3], "selective": figlib.RANKS[1], "full": figlib.RANKS[0]}


def curve(ax, samples, colour, label=None, t0=0.0):
    xs = [(t - t0) * 1e3 for t, _ in samples]
    ys = [figlib.mib(b) for _, b in samples]
    ax.plot(xs, ys, drawstyle="steps-post", color=colour, linewidth=1.1, label=label)
    return max(ys) if ys else 0


def step(args):
    d = figlib.load(args.data)
    fig, ax = plt.subplots(figsize=(figlib.WIDTH, 3.8))
    marks = d["marks"]
    end = d["samples"][-1][0]
    step_no = 0
    for i, (label, t) in enumerate(marks):
        if label not in PHASES:
            continue
        t_next = marks[i + 1][1] if i + 1 < len(marks) else end
        ax.axvspan(t * 1e3, t_next * 1e3, color=PHASES[label], alpha=0.10, linewidth=0)
        if label == "forward":
            step_no += 1
            ax.text(t * 1e3, 1.0, f" step {step_no}", transform=ax.get_xaxis_transform(),
                    va="top", fontsize=8, fontweight="bold")
        ax.text((t + t_next) / 2 * 1e3, 0.02, label, transform=ax.get_xaxis_transform(),
                ha="center", fontsize=figlib.SMALL, color=PHASES[label])
    peak = curve(ax, d["samples"], "#222222", "live bytes (tracker)")

    def at(t):  # live bytes just before time t
        before = [b for s, b in d["samples"] if s <= t]
        return before[-1] if before else 0

    for i, (label, t) in enumerate(marks):
        if label == "optimizer" and i + 1 < len(marks):
            grew = at(marks[i + 1][1]) - at(t)
            if grew > 0:
                ax.annotate(f"optimizer step: +{figlib.human_bytes(grew)}\n(AdamW's m and v appear)",
                            xy=(marks[i + 1][1] * 1e3, figlib.mib(at(marks[i + 1][1]))),
                            xytext=(10, 40), textcoords="offset points", fontsize=figlib.SMALL,
                            arrowprops={"arrowstyle": "->", "linewidth": 0.8})
                break
    p = d["predicted"]
    lines = [(p["params"], "parameters"),
             (p["params"] + p["grads"] + p["optimizer"], "+ gradients\n+ AdamW state"),
             (p["peak"], "predicted peak\n(lab 06's estimate)")]
    for value, label in lines:
        ax.axhline(figlib.mib(value), color="#777777", linestyle="--", linewidth=0.8)
        ax.text(end * 1e3, figlib.mib(value), f" {label}", va="center", fontsize=figlib.SMALL,
                color="#444444")
    ax.set_xlim(0, end * 1e3)
    ax.set_ylim(0, max(peak, figlib.mib(p["peak"])) * 1.12)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("live bytes above the start (MiB)")
    ax.set_title(f"{figlib.short_model(d['model'])};\nbatch {d['batch']} x {d['seq']} tokens, "
                 "float32, AdamW", loc="left")
    fig.suptitle("Memory over two training steps", x=0.0, ha="left", fontsize=figlib.SUPTITLE,
                 fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source or "./lab run 06 -- --json FILE",
                measured=figlib.machine(1))


def recompute(args):
    d = figlib.load(args.data)
    fig, ax = plt.subplots(figsize=(figlib.WIDTH, 4.0))
    end = 0.0
    top = 0.0
    quoted = []
    for pol in d["policies"]:
        name = pol["name"]
        colour = POLICY.get(name, None)
        top = max(top, curve(ax, pol["samples"], colour,
                             f"{name}: kept {figlib.mib(pol['kept']):.1f} MiB after forward, "
                             f"peak {figlib.mib(pol['peak']):.1f} MiB"))
        end = max(end, pol["samples"][-1][0])
        t0 = pol["samples"][0][0] if pol["samples"] else 0.0
        marks = dict((label, t) for label, t in pol["marks"])
        for label, t in pol["marks"]:
            if label == "backward":
                ax.axvline(t * 1e3, color=colour, linestyle=":", linewidth=0.9)
        quoted.append({k: pol[k] for k in ("name", "predicted_kept", "kept", "predicted_peak",
                                           "peak")})
        quoted[-1]["step"] = marks.get("end", pol["samples"][-1][0] if pol["samples"] else t0) - t0
        quoted[-1]["forward"] = marks.get("backward", t0) - t0
    ax.set_xlim(0, end * 1e3)
    ax.set_ylim(0, top * 1.45)  # the legend above the curves
    ax.set_xlabel("time from the start of the step (ms); dotted: where backward starts")
    ax.set_ylabel("live bytes above the model (MiB)")
    ax.legend(frameon=False, loc="upper right")
    ax.set_title(f"{figlib.short_model(d['model'])};\nbatch {d['batch']} x {d['seq']} tokens: "
                 "forward, then backward", loc="left")
    fig.suptitle("Memory over one step, with and without recomputation", x=0.0, ha="left",
                 fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source or "./lab run 13 -- --json FILE",
                measured=figlib.machine(1), quoted={"policies": quoted})


def main():
    figlib.cli(__doc__, {"step": step, "recompute": recompute})


if __name__ == "__main__":
    main()
