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
    fig, (tput, mem) = plt.subplots(1, 2, figsize=(10, 0.9 + 0.27 * n), sharey=True,
                                    gridspec_kw={"width_ratios": [2.2, 1]})
    y = list(range(n))
    chosen = next((i for i, p in enumerate(shown) if p.get("verdict") == "chosen"), 0)
    colours = [figlib.RANKS[3] if i == chosen else figlib.RANKS[0] for i in range(n)]
    tput.barh(y, [p["tokens_per_s"] / 1e3 for p in shown], color=colours, height=0.7)
    for i, p in enumerate(shown):
        tput.text(p["tokens_per_s"] / 1e3, i, f" {p['tokens_per_s'] / 1e3:,.0f}k  MFU "
                  f"{100 * p['mfu']:.0f}%" + ("  chosen" if i == chosen else ""), va="center", fontsize=7)
    tput.set_yticks(y, [label(p) for p in shown], fontsize=7.5, family="DejaVu Sans Mono")
    tput.set_ylim(n - 0.4, -0.6)
    tput.set_xlabel("predicted tokens / s (thousands)")
    tput.set_xlim(0, max(p["tokens_per_s"] for p in shown) / 1e3 * 1.55)
    best = max(p["tokens_per_s"] for p in plans) / 1e3
    tput.axvline(0.95 * best, color="#333333", linestyle="--", linewidth=0.8)
    tput.text(0.95 * best, n - 0.45, " 95% of the fastest", fontsize=7, va="bottom")
    tput.set_title("predicted throughput: the chosen plan (the simplest within 5% of the "
                   "fastest), then the rest", loc="left", fontsize=9)
    mem.barh(y, [p["memory_gb_per_gpu"] for p in shown], color="#8C8C8C", height=0.7)
    mem.set_xlabel("memory per GPU (GB)")
    mem.set_title("memory", loc="left", fontsize=9)
    fig.suptitle(f"The planner's best {n} of {len(plans)} plans that fit"
                 + (f": {args.title}" if args.title else ""), x=0.0, ha="left", fontsize=11,
                 fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source)


if __name__ == "__main__":
    main()
