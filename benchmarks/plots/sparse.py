"""Gradient compression: loss curves and reduce bytes per step of dense fp32, int8 / int4 qgZ
and top-k sparsified gradients, from the JSON of benchmarks/sparse_grads.py."""
from __future__ import annotations

import numpy as np

from benchmarks.plots import figure, machine_text

STYLE = {  # variant -> (legend label, colour)
    "dense": ("dense fp32", "#000000"),
    "int8": ("int8 qgZ", "#1f77b4"),
    "int4_ef": ("int4 qgZ + error feedback", "#17becf"),
    "topk_10%": ("top-k 10% + error feedback", "#2ca02c"),
    "topk_1%": ("top-k 1% + error feedback", "#ff7f0e"),
    "topk_0.1%": ("top-k 0.1% + error feedback", "#d62728"),
    "topk_1%_noef": ("top-k 1%, no error feedback", "#9467bd"),
    "topk_1%_warmup50": ("top-k 1% + error feedback, 50 dense warmup steps", "#8c564b"),
}


def _smooth(values, width: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if width <= 1 or len(v) < width:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    head = c[1:width] / np.arange(1, width)
    return np.concatenate([head, (c[width:] - c[:-width]) / width])


def caption(result: dict, source: str) -> str:
    m = result.get("machine") or {}
    load = (f" Load average {m['load_avg_start']:.0f} at the start, {m['load_avg_end']:.0f} at "
            "the end (a shared machine: step times are noisy)." if "load_avg_end" in m else "")
    return (f"{result['model']} GPT ({(result.get('num_params') or 0) / 1e6:.2f}M params), "
            f"ZeRO-3, world {result['world']} on gloo/CPU, micro batch {result['micro_batch']} "
            f"x seq 128 per rank, {result['steps']} steps, "
            f"{result.get('optimizer', 'AdamW')} with the "
            f"demo's warmup-decay schedule. "
            f"Bytes: this rank's gradient-reduce bytes per step as handed to the collectives "
            f"(last_step_stats.reduce_bytes). Final loss: mean of the last {result['last']} "
            f"steps. Machine: {machine_text(m)}.{load} Command: {result.get('command', '')}. "
            f"Data: {source}.")


def sparse_figure(result: dict, source: str = "sparse_grads.json"):
    runs, summary = result["runs"], result["summary"]
    names = [n for n in STYLE if n in runs] + [n for n in runs if n not in STYLE]
    fig, axes = figure(12, 4.8, caption(result, source), ncols=2)
    ax = axes[0, 0]
    width = max(1, len(next(iter(runs.values()))["losses"]) // 30)
    for n in names:
        label, colour = STYLE.get(n, (n, None))
        s = summary[n]
        ax.plot(np.arange(1, len(runs[n]["losses"]) + 1), _smooth(runs[n]["losses"], width),
                color=colour, lw=1.4 if n == "dense" else 1.1,
                label=f"{label}: final {s['final_loss']:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"training loss (cross-entropy, loss units; mean over ranks, {width}-step "
                  "moving average)", fontsize=8)
    ax.set_title("Loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[0, 1]
    x = np.arange(len(names))
    mib = [summary[n]["reduce_bytes_per_step"] / 2 ** 20 for n in names]
    bars = ax.bar(x, mib, color=[STYLE.get(n, (n, "#888888"))[1] for n in names])
    ax.set_yscale("log")
    ax.set_ylim(min(mib) / 3, max(mib) * 6)
    for b, n in zip(bars, names):
        s = summary[n]
        ax.annotate(f"{s.get('bytes_vs_dense', 1):.3g}x bytes\n"
                    f"{s.get('step_time_vs_dense', 1):.2f}x time",
                    (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(x, [STYLE.get(n, (n,))[0].replace(" + error feedback", "\n+ EF")
                      .replace(", ", ",\n") for n in names], fontsize=6)
    ax.set_ylabel("gradient-reduce MiB per step per rank (log)")
    ax.set_xlabel("gradient reduce")
    ax.set_title("Reduce bytes per step; labels: bytes and median step time vs dense")
    fig.suptitle(f"Top-k sparsified gradients vs quantized vs dense: {result['model']} GPT, "
                 f"{result['steps']} steps, {result.get('optimizer', 'AdamW')}")
    return fig


STUDY_CURVES = ("dense", "ef_1%", "noef_1%", "block_v", "update_ef", "update_ef_ramp", "sign_dct2")


def study_figure(result: dict, source: str = "sparse_adam_study.json"):
    """benchmarks/sparse_adam_study.py: loss curves of the main variants, and every variant's
    final loss vs dense against the issue's 3% line."""
    runs = result["runs"]
    dense = runs["dense"]["final_loss"]
    cap = (f"Single-process simulation of the world-2 top-k reduce (per gather unit, per rank) "
           f"on the make-demo GPT: AdamW lr 3e-3 betas (0.9, 0.95), warmup 20 then linear "
           f"decay, clipping 1.0, {result['steps']} steps, micro batch {result['micro_batch']} "
           f"x 128 tokens per rank, same weights and data for every variant. Final loss: mean "
           f"of the last {result['last']} steps. Bytes: 8 per selected entry over 4 per dense "
           f"element. Losses only, no timings: the machine does not change them. "
           f"Command: {result.get('command', '')}. Data: {source}.")
    fig, axes = figure(13, 5.2, cap, ncols=2)
    ax = axes[0, 0]
    width = max(1, result["steps"] // 30)
    for name in [n for n in STUDY_CURVES if n in runs]:
        r = runs[name]
        ax.plot(np.arange(1, len(r["losses"]) + 1), _smooth(r["losses"], width),
                lw=1.4 if name == "dense" else 1.0, color="#000000" if name == "dense" else None,
                label=f"{r['label']}: {r['final_loss']:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"training loss (cross-entropy, nats; {width}-step moving average)")
    ax.set_title("Loss, main variants (top-k 1%)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[0, 1]
    names = [n for n in runs if n != "dense"]
    gap = [100 * (runs[n]["final_loss"] / dense - 1) for n in names]
    y = np.arange(len(names))
    ax.barh(y, gap, color=["#2ca02c" if g <= 3 else "#ff7f0e" for g in gap])
    for yi, n, g in zip(y, names, gap):
        ax.annotate(f"{g:+.1f}%, {runs[n]['bytes_vs_dense']:.3f}x bytes", (max(g, 0), yi),
                    va="center", fontsize=6, xytext=(2, 0), textcoords="offset points")
    ax.axvline(3, color="#d62728", ls="--", lw=1, label="issue 27's target: +3%")
    ax.set_yticks(y, [runs[n]["label"] for n in names], fontsize=6)
    ax.invert_yaxis()
    ax.set_ylabel("variant (top-k 1% unless the label says)")
    ax.set_xlabel("final loss vs dense AdamW (%)")
    ax.set_title("Every variant: final loss vs dense; label: bytes vs dense")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Top-k 1% under AdamW: what was tried (simulation, demo GPT)")
    return fig
