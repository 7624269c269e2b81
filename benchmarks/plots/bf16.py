"""bf16 study: how far each engine's bf16 run drifts from its own fp32 run, from the JSON of
benchmarks/bf16_study.py (grouped bars per workload, one bar per engine: mean over seeds of
the mean |bf16 loss - fp32 loss| over steps, the standard deviation over seeds as the error
bar, and each seed as a dot)."""
from __future__ import annotations

import numpy as np

from benchmarks.plots import figure

ENGINES = {  # key in the study -> (legend label, colour)
    "zerolite": ("zerolite ZeRO-3 (bf16 params, fp32 masters)", "#1f77b4"),
    "reference": ("plain torch, same recipe and batch split", "#aec7e8"),
    "torch-1": ("plain torch, one backward over the batch", "#ff7f0e"),
    "deepspeed": ("DeepSpeed ZeRO-3", "#d62728"),
}


def caption(study: dict, source: str) -> str:
    steps = ", ".join(f"{w} {v[0]}" for w, v in study.get("workloads", {}).items())
    exact = ", ".join(f"{w} {v:g}" for w, v in
                      study.get("zerolite_vs_reference_max_abs_dloss", {}).items())
    return (f"ZeRO-3, world {study.get('world')}, seeds {study.get('seeds')}; steps per "
            f"workload {steps}. cnn: the DeepSpeed CIFAR-10 tutorial's CNN with its loss in "
            f"bf16 (as the tutorial computes it); cnn-fp32loss: the loss in fp32; gpt: "
            f"zerolite's small GPT. zerolite vs the plain-torch reference, max |dloss| over all "
            f"steps and seeds: {exact}. Missing bars: not run. Machine and versions: "
            + "; ".join(study.get("notes", [])) + f". Data: {source}.")


def bf16_figure(study: dict, source: str = "bf16_study.json"):
    """Grouped bars per workload from a bf16_study JSON (as loaded)."""
    summary = study["summary"]
    workloads = list(study.get("workloads") or next(iter(summary.values())))
    engines = [e for e in ENGINES if e in summary]
    fig, axes = figure(10, 4.8, caption(study, source))
    ax = axes[0, 0]
    x = np.arange(len(workloads))
    bar = 0.8 / len(engines)
    for k, engine in enumerate(engines):
        label, colour = ENGINES[engine]
        pos = x - 0.4 + bar * (k + 0.5)
        rows = [summary[engine].get(w) for w in workloads]
        means = [r["mean"] if r else np.nan for r in rows]
        errs = [r["stdev"] if r else 0 for r in rows]
        ax.bar(pos, means, bar, yerr=errs, capsize=3, color=colour, label=label,
               edgecolor="white")
        for p, r in zip(pos, rows):
            if r:
                seeds = list(r["per_seed"].values())
                ax.plot([p] * len(seeds), seeds, ".", color="black", ms=4, alpha=0.6)
    ax.plot([], [], ".", color="black", label="one seed")
    ax.set_yscale("log")
    ax.set_xticks(x, workloads)
    ax.set_xlabel("workload")
    ax.set_ylabel("mean over steps of |bf16 loss - fp32 loss|\n(loss units, log scale)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("bf16 drift from each engine's own fp32 run (lower is closer; error bar = "
                 "stdev over seeds)", fontsize=11)
    return fig
