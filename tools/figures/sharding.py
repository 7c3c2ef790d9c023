#!/usr/bin/env python3
"""What each rank keeps under ZeRO and FSDP (labs 14 and 15).

  sharding.py zero DATA.json OUT.svg   lab 14 (`lab14_run --json`): model state per rank for
                                       data parallelism and ZeRO stages 1-3: the paper's 7.5B
                                       model on 64 GPUs (formula), and this run (formula,
                                       measured after the last step)
  sharding.py fsdp DATA.json OUT.svg   lab 15 (`lab15_run --json`): FSDP's strategies for a 7B
                                       model on 64 GPUs (formula), and this run's predicted
                                       parameter bytes against the measured step peak

The formula panels are the same on every machine; the measured points name the machine.
"""

import figlib
from figlib import plt

KINDS = [("params", "parameters", figlib.PARAMS), ("grads", "gradients", figlib.GRADS),
         ("optimizer", "optimizer state", figlib.OPTIMIZER)]
STAGE = {0: "DP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def stacked(ax, names, parts, scale, unit):
    """parts: [(label, colour, [value per name])]; bars with their totals on top."""
    bottoms = [0.0] * len(names)
    for label, colour, values in parts:
        vals = [v / scale for v in values]
        ax.bar(range(len(names)), vals, bottom=bottoms, width=0.65, color=colour, label=label,
               edgecolor="white", linewidth=0.8)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    top = max(bottoms)
    for i, b in enumerate(bottoms):
        ax.text(i, b + 0.01 * top, f"{b:.3g} {unit}", ha="center", va="bottom", fontsize=figlib.SMALL)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, top * 1.15)
    return top


def zero(args):
    d = figlib.load(args.data)
    fig, (big, run) = plt.subplots(1, 2, figsize=(figlib.WIDTH, 3.9))
    at = d["at_scale"]
    stacked(big, [STAGE[s["stage"]] for s in at],
            [(lab, col, [s["bytes"][k] for s in at]) for k, lab, col in KINDS], 1e9, "GB")
    big.set_ylabel("GB per GPU")
    big.set_title(f"{at[0]['parameters'] / 1e9:g}B parameters on {at[0]['ranks']} GPUs,\n"
                  "mixed-precision Adam\n(2 + 2 + 12 bytes per parameter)", loc="left")
    st = d["stages"]
    top = stacked(run, [STAGE[s["stage"]] for s in st],
                  [(lab, col, [s["predicted"][k] for s in st]) for k, lab, col in KINDS],
                  2**20, "MiB")
    run.plot(range(len(st)), [figlib.mib(s["held"]) for s in st], linestyle="none",
             marker="D", color="black", markersize=5, label="measured (tracker)")
    run.set_ylim(0, max(top, max(figlib.mib(s["held"]) for s in st)) * 1.15)
    run.set_ylabel("MiB per rank")
    run.set_title(f"this run: {d['parameters'] / 1e6:.2f}M parameters on {d['ranks']} ranks,\n"
                  "float32 AdamW (4 + 4 + 8 bytes),\nafter a step", loc="left")
    run.legend(frameon=False, loc="upper right")
    fig.suptitle("What each ZeRO stage keeps per rank", x=0.0, ha="left", fontsize=figlib.SUPTITLE,
                 fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source or f"./lab run 14 -n {d['ranks']} -- --json FILE",
                measured=figlib.machine(d["ranks"]) + " (the diamonds)")


def fsdp(args):
    d = figlib.load(args.data)
    fig, (big, run) = plt.subplots(1, 2, figsize=(figlib.WIDTH, 4.4),
                                   gridspec_kw={"width_ratios": [1, 1.15]})
    at = d["at_scale"]
    ss = at["strategies"]
    parts = [("parameter shards", figlib.PARAMS, [s["params_sharded"] for s in ss]),
             ("gathered parameters", "#9DB4D8", [s["params_gathered"] for s in ss]),
             ("gradients", figlib.GRADS, [s["grads"] for s in ss]),
             ("optimizer state", figlib.OPTIMIZER, [s["optimizer"] for s in ss])]
    names = [s["name"].replace("_", "_\u200b") for s in ss]
    stacked(big, names, parts, 1e9, "GB")
    big.axhline(80, color="#C44E52", linestyle="--", linewidth=0.8)
    big.text(len(ss) - 0.5, 80, "80 GB ", color="#C44E52", ha="right", va="bottom",
             fontsize=figlib.SMALL)
    big.set_ylabel("GB of model state per GPU")
    big.tick_params(axis="x", labelsize=figlib.SMALL, labelrotation=30)
    for t in big.get_xticklabels():
        t.set_ha("right")
    big.set_title(f"{at['parameters'] / 1e9:.2f}B parameters, {at['gpus']} GPUs\n"
                  f"({at['gpus_per_node']} per node), mixed precision", loc="left")
    big.legend(frameon=False, fontsize=figlib.SMALL, loc="upper right")
    rows = d["rows"]
    x = range(len(rows))
    pred = [figlib.mib(r["predicted"]) if r["predicted"] >= 0 else 0 for r in rows]
    peak = [figlib.mib(r["peak"]) for r in rows]
    run.bar([i - 0.19 for i in x], pred, width=0.36, color=figlib.PARAMS,
            label="parameters, predicted (shards + most gathered at once)")
    run.bar([i + 0.19 for i in x], peak, width=0.36, color="#555555",
            label="step peak, measured (with activations and gradients)")
    for i, r in enumerate(rows):
        if r["predicted"] < 0:
            run.text(i - 0.19, 0, "-", ha="center", va="bottom", fontsize=8)
    run.set_xticks(list(x), [r["name"].replace("_", "_\u200b") for r in rows],
                   fontsize=figlib.SMALL, rotation=30, ha="right")
    run.set_ylabel("MiB per rank")
    run.set_ylim(0, max(peak + pred) * 1.55)
    run.set_title(f"this run, {d['ranks']} ranks:\n{figlib.short_model(d['model'])}", loc="left",
                  fontsize=8)
    run.legend(frameon=False, fontsize=figlib.SMALL, loc="upper left")
    fig.suptitle("What each FSDP strategy keeps per rank", x=0.0, ha="left", fontsize=figlib.SUPTITLE,
                 fontweight="bold")
    fig.tight_layout()
    figlib.save(fig, args.out, args.source or f"./lab run 15 -n {d['ranks']} -- --json FILE",
                measured=figlib.machine(d["ranks"]) + " (right panel)")


def main():
    figlib.cli(__doc__, {"zero": zero, "fsdp": fsdp})


if __name__ == "__main__":
    main()
