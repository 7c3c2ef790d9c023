#!/usr/bin/env python3
"""The planner's throughput against the layout (lab 20), from `lab20_run ... --json FILE`.

  planner.py DATA.json OUT.svg [--title "GPT-3 175B on 1024 A100-80GB, batch 1536"] [--top 16]

Every plan that fits, best first (the file's order): predicted tokens/s per layout (tp x pp x
dp, ZeRO stage, recomputation, micro-batch, interleaving), memory per GPU beside it; the chosen
plan in the accent colour. The planner's own model: the same on every machine.
"""

import argparse

import figlib
from figlib import plt


def label(p):
    out = f"tp{p['tp']} pp{p['pp']} dp{p['dp']}"
    if p.get("cp", 1) > 1:
        out += f" cp{p['cp']}"
    out += f"  ZeRO-{p['zero_stage']} {p['checkpointing']} mb{p['micro_batch']}"
    if p.get("virtual_stages", 1) > 1:
        out += f" v{p['virtual_stages']}"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--source", default="./lab run 20 -- --model M --cluster C --batch B --json FILE")
    args = ap.parse_args()
    plans = figlib.load(args.data)
    shown = plans[: args.top]
    n = len(shown)
    fig, (tput, mem) = plt.subplots(1, 2, figsize=(figlib.WIDTH, 1.5 + 0.25 * n), sharey=True,
                                    gridspec_kw={"width_ratios": [2.3, 1]})
    y = list(range(n))
    chosen = next((i for i, p in enumerate(shown) if p.get("verdict") == "chosen"), 0)
    colours = [figlib.RANKS[3] if i == chosen else figlib.RANKS[0] for i in range(n)]
    # The plans differ by a few percent: throughput as a share of the fastest plan, on an axis
    # that spans only the shares drawn (dots, not bars from zero, which would hide them).
    best = max(p["tokens_per_s"] for p in plans)
    share = [100 * p["tokens_per_s"] / best for p in shown]
    lo = min(min(share), 95.0) - 1.0
    tput.hlines(y, lo, share, color="#CCCCCC", linewidth=1.0, zorder=1)
    tput.scatter(share, y, color=colours, s=22, zorder=2)
    for i, p in enumerate(shown):
        tput.text(share[i], i, f"  {p['tokens_per_s'] / 1e3:,.0f}k, MFU {100 * p['mfu']:.0f}%"
                  + (", chosen" if i == chosen else ""), va="center", fontsize=figlib.SMALL,
                  color=figlib.RANKS[3] if i == chosen else "#333333")
    tput.set_yticks(y, [label(p) for p in shown], fontsize=figlib.SMALL,
                    family=["DejaVu Sans Mono", "monospace"])
    tput.tick_params(axis="y", length=0)
    tput.set_ylim(n - 0.4, -0.6)
    tput.set_xlim(lo, 100 + (100 - lo) * 0.55)  # room for the labels right of the dots
    tput.set_xticks([t for t in range(int(lo) + 1, 101) if t % (1 if 100 - lo < 8 else 2) == 0])
    tput.set_xlabel("predicted tokens / s, % of the fastest plan")
    tput.axvline(95.0, color="#333333", linestyle="--", linewidth=0.8)
    tput.text(95.0, n - 0.45, " 95% of the fastest", fontsize=figlib.SMALL, va="bottom")
    tput.set_title("predicted throughput", loc="left")
    mem.barh(y, [p["memory_gb_per_gpu"] for p in shown], color="#8C8C8C", height=0.7)
    mem.set_xlabel("memory per GPU (GB)")
    mem.set_title("memory", loc="left")
    mem.tick_params(axis="y", length=0)
    fig.suptitle(f"The planner's best {n} of {len(plans)} plans that fit"
                 + (f":\n{args.title}" if args.title else "") + "\n(red: the chosen plan, the "
                 "simplest within 5% of the fastest)", x=0.0,
                 ha="left",
                 fontsize=figlib.SUPTITLE, fontweight="bold")
    fig.tight_layout()
    # The suptitle's lines above the panels' titles (tight_layout leaves it overlapping).
    fig.subplots_adjust(top=1 - 0.95 / fig.get_figheight())
    figlib.save(fig, args.out, args.source)


if __name__ == "__main__":
    main()
