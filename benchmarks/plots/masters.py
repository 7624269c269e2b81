"""bf16 master weights: loss curves of fp32 / bf16 with fp32 masters / bf16 masters under each
rounding, and the model-state bytes per parameter, from benchmarks/bf16_masters.py's JSON."""
from __future__ import annotations

import numpy as np

from benchmarks.plots import figure, machine_text
from benchmarks.plots.sparse import _smooth

STYLE = {  # variant -> (legend label, colour)
    "fp32": ("fp32 training", "#000000"),
    "bf16": ("bf16, fp32 masters + moments", "#1f77b4"),
    "nearest": ("bf16 masters + moments, round to nearest (DeepSpeed)", "#d62728"),
    "kahan": ("bf16 masters + moments, Kahan compensation", "#2ca02c"),
    "stochastic": ("bf16 masters + moments, stochastic rounding", "#ff7f0e"),
}


def masters_figure(result: dict, source: str = "bf16_masters.json"):
    runs, summary = result["runs"], result["summary"]
    names = [n for n in STYLE if n in runs]
    m = result.get("machine") or {}
    caption = (f"{result['model']} GPT ({(result.get('num_params') or 0) / 1e6:.2f}M params), "
               f"ZeRO-3, world {result['world']} on gloo/CPU, micro batch "
               f"{result['micro_batch']} x seq 128 per rank, {result['steps']} steps, AdamW peak lr "
               f"{result.get('lr', 3e-3):g} with the demo's warmup-decay-to-0 schedule, clipping 1.0, same weights "
               f"and batches for every variant. Final loss: mean of the last {result['last']} "
               "steps. Bytes: params + gradient shards + masters + optimizer state from "
               "engine.memory_stats(), all ranks, at the last accumulation boundary. Machine: "
               f"{machine_text(m)}. Command: {result.get('command', '')}. Data: {source}.")
    fig, axes = figure(12, 4.8, caption, ncols=2)
    ax = axes[0, 0]
    width = max(1, len(next(iter(runs.values()))["losses"]) // 30)
    for n in names:
        label, colour = STYLE[n]
        ax.plot(np.arange(1, len(runs[n]["losses"]) + 1), _smooth(runs[n]["losses"], width),
                color=colour, lw=1.2, label=f"{label}: final {summary[n]['final_loss']:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"training loss (cross-entropy, nats; {width}-step moving average)",
                  fontsize=8)
    ax.set_title("Loss")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    values = [summary[n]["state_bytes_per_param"] for n in names]
    bars = ax.bar(range(len(names)), values, color=[STYLE[n][1] for n in names],
                  label="measured (memory_stats)")
    for b, v in zip(bars, values):
        ax.annotate(f"{v:.1f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(range(len(names)), [n for n in names], fontsize=8)
    ax.set_xlabel("variant")
    ax.set_ylabel("model-state bytes per parameter (all ranks)")
    ax.set_title("Memory")
    ax.legend(fontsize=7)
    fig.suptitle("bf16 master weights: quality and memory")
    return fig
