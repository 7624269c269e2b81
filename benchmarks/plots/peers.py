"""zerolite vs its peers (DeepSpeed ZeRO-3, FSDP2, DDP): grouped bars from a peers JSON.

The JSON is what ``python -m benchmarks.peers.run`` writes (benchmarks/results/peers*.json).
One group of bars per cell (model size, dtype, world, config, micro-batch x accumulation),
one bar per engine, in three panels: wall time per step, CPU time per step (busiest rank)
and peak resident memory per rank. DDP and FSDP2 read no ZeRO key: their one run per
(size, dtype, world, accumulation) stands in every config's group, as in the Markdown report.
"""
from __future__ import annotations

import numpy as np

from benchmarks.plots import ENGINES, figure, machine_text

METRICS = (  # result key, y-axis label, panel title
    ("median_step_s", "seconds per step (median, slowest rank)", "Wall time per optimizer step"),
    ("cpu_s_per_step", "CPU seconds per step (busiest rank)", "CPU time per optimizer step"),
    ("peak_rss_mib", "MiB (peak RSS, largest rank)", "Peak resident memory per rank"),
)


def _cell(r: dict) -> tuple:
    return (r["size"], r["dtype"], r["world"], r.get("config", "tuned"), r.get("gas", 1))


def _lookup(by_key: dict, engine: str, c: tuple):
    return by_key.get((engine, *c)) or by_key.get((engine, *c[:3], "any", c[4]))


def cells(report: dict) -> list[tuple]:
    """Cells in the order the report ran them; 'any' (config-free engines) is not a cell."""
    out = []
    for r in report["results"]:
        c = _cell(r)
        if c[3] != "any" and c not in out:
            out.append(c)
    return out


def _label(report: dict, c: tuple, varying: set) -> str:
    mb = report["sizes"][c[0]]["global_batch"] // c[2] // c[4]
    head = " ".join(f"world {v}" if i == 2 else str(v)
                    for i, v in enumerate(c[:3]) if i in varying)
    return (head + "\n" if head else "") + f"{c[3]}\n{mb}x{c[4]}"


def caption(report: dict, source: str, note: str = "") -> str:
    s = report.get("settings", {})
    sizes = "; ".join(f"{k}: {v['params'] / 1e6:.1f}M-param GPT ({v['n_layer']} layers x "
                      f"d_model {v['d_model']}, seq {v.get('seq_len', 128)}, global batch "
                      f"{v['global_batch']})" for k, v in report.get("sizes", {}).items())
    return (f"{sizes}. World {','.join(map(str, s.get('worlds', [])))}, "
            f"{','.join(s.get('dtypes', []))}, AdamW, clipping 1.0; {s.get('steps')} timed "
            f"steps after {s.get('warmup')} warm-up; groups: config and micro-batch x "
            f"gradient accumulation. Machine: {machine_text(report.get('machine'))}; every "
            f"engine on the same JSON config, no environment tuning. {note}Data: {source}.")


def peers_figure(report: dict, source: str = "peers.json", title: str | None = None,
                 note: str = ""):
    """Grouped bars of every engine in every cell of a peers report (as loaded from JSON)."""
    ok = [r for r in report["results"] if r.get("status") == "ok"]
    by_key = {(r["engine"], *_cell(r)): r for r in ok}
    engines = [e for e in ENGINES if any(r["engine"] == e for r in ok)]
    cs = [c for c in cells(report) if any(_lookup(by_key, e, c) for e in engines)]
    varying = {i for i in range(3) if len({c[i] for c in cs}) > 1}
    labels = [_label(report, c, varying) for c in cs]
    width = max(8.0, 1.2 + 0.22 * len(engines) * len(cs))
    fig, axes = figure(width, 8.6, caption(report, source, note), nrows=len(METRICS))
    x = np.arange(len(cs))
    bar = 0.8 / max(len(engines), 1)
    for ax, (key, ylabel, panel) in zip(axes[:, 0], METRICS):
        for k, engine in enumerate(engines):
            name, colour = ENGINES[engine]
            vals = [(_lookup(by_key, engine, c) or {}).get(key) for c in cs]
            ys = [np.nan if v is None else v for v in vals]
            ax.bar(x - 0.4 + bar * (k + 0.5), ys, bar, label=name, color=colour)
        ax.set_title(panel, fontsize=10, loc="left")
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_xlabel("config, micro-batch x gradient accumulation", fontsize=9)
        ax.set_xticks(x, labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right center", fontsize=8, title="engine",
               title_fontsize=8)
    s = report.get("settings", {})
    fig.suptitle(title or f"zerolite vs peers, {'/'.join(s.get('sizes', []))} GPT, world "
                 f"{'/'.join(map(str, s.get('worlds', [])))}, "
                 f"{'/'.join(s.get('dtypes', []))} (lower is better)", fontsize=12)
    return fig
