"""Offload capacity: the largest GPT that trains within a per-rank memory budget, by offload
mode, stage-3 reuse distance, precision (fp32, bf16 with fp32 masters, bf16 masters + bf16
optimizer states) and engine (zerolite, DeepSpeed), from the JSON of
benchmarks/offload_capacity.py.

Left: the largest model that fit (bars, labelled with its depth). Right: every probe's peak
RSS (the larger rank) against model size, one line per setting, the budget as a dashed line
and the first depth that did not fit as a cross on it. zerolite fp32 rows are coloured by offload mode,
the others by precision; DeepSpeed's rows are cross-hatched and dash-dotted. A search that
DeepSpeed refused or crashed shows its error in place of a bar.
"""
from __future__ import annotations

import os
import textwrap

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from benchmarks.plots import figure

MODES = {  # mode -> (legend label, colour)
    "none": ("no offload", "#7f7f7f"),
    "nvme": ("offload_optimizer: nvme", "#1f77b4"),
    "nvme+param": ("offload_optimizer + offload_param: nvme", "#9467bd"),
}
PRECISIONS = {  # precision -> (legend label, colour, short label) for all but zerolite fp32
    "fp32": ("fp32", "#7f7f7f", "fp32"),
    "bf16": ("bf16, fp32 masters + fp32 Adam moments", "#ff7f0e", "bf16 (fp32 masters)"),
    "bf16_masters": ("bf16 masters + bf16 Adam moments", "#2ca02c", "bf16 masters + states"),
}
ENGINE_NAMES = {"zerolite": "zerolite", "deepspeed": "DeepSpeed"}


def settings(results: list[tuple[str, dict]]) -> list[dict]:
    """One row per (file, search): label, engine, precision, mode, reuse distance, largest
    fit, probes, error. A search copied from another file that is drawn too (reused_from)
    is drawn once, from that file."""
    rows = []
    sources = {source for source, _ in results}
    for source, data in results:
        cfg = data["config"]
        reuse = cfg.get("reuse_distance")
        for key, res in data.items():
            if key in ("config", "note") or not isinstance(res, dict) or "probes" not in res:
                continue
            if os.path.basename(res.get("reused_from") or "") in sources:
                continue
            mode = res.get("mode", key)
            engine, precision = res.get("engine", "zerolite"), res.get("precision", "fp32")
            reuse_text = "DeepSpeed's default reuse distance" if reuse is None \
                else f"reuse distance {reuse}"
            parts = [MODES.get(mode, (mode,))[0], reuse_text]
            if (engine, precision) != ("zerolite", "fp32") or "," in cfg.get("dtype", ""):
                parts.insert(0, f"{ENGINE_NAMES.get(engine, engine)} "
                                f"{PRECISIONS[precision][2]}")
            label = ", ".join(parts)
            colour = MODES.get(mode, (mode, "#333333"))[1] \
                if (engine, precision) == ("zerolite", "fp32") else PRECISIONS[precision][1]
            rows.append({"mode": mode, "reuse": reuse, "source": source, "config": cfg,
                         "engine": engine, "precision": precision, "label": label,
                         "tick": "\n".join(parts),
                         "colour": colour, "error": res.get("error"),
                         "largest": res.get("largest"), "probes": res["probes"],
                         "failing": res.get("smallest_failing_layers")})
    return rows


def _peak(probe: dict) -> float | None:
    peaks = [r["peak_rss_mib"] for r in probe.get("ranks", []) if r.get("peak_rss_mib")]
    return max(peaks) if peaks else None


def caption(rows: list[dict]) -> str:
    cfg = rows[0]["config"]
    precisions = sorted({r["precision"] for r in rows}, key=list(PRECISIONS).index)
    engines = sorted({r["engine"] for r in rows})
    dtype = cfg["dtype"] if precisions == ["fp32"] else "precision per row (bf16 masters: " \
        "bf16.bf16_master_weights_and_grads + bf16_optimizer_states, zerolite rounds to " \
        "nearest)"
    peer = ("; DeepSpeed rows: DeepSpeed " + _ds_version(rows) + " on the same model and "
            "config under deepspeed.zero.Init, torch_adam, DS_ACCELERATOR=cpu, gloo") \
        if "deepspeed" in engines else ""
    return (f"zerolite's GPT (d_model {cfg['d_model']}, vocab {cfg['vocab']}, seq {cfg['seq']}, "
            f"micro-batch {cfg['batch']} per rank) built under zero.Init, ZeRO-3, world "
            f"{cfg['world_size']}, {dtype}{peer}, {cfg['optimizer']}, sub_group_size "
            f"{cfg['sub_group_size']:.0e}, {cfg['steps']} steps per probe; a probe fits when "
            f"both ranks finish with ru_maxrss <= {cfg['budget_mib']} MiB. Depth searched by "
            f"growing (x2, or the run's --grow) then bisection; read the result as +-1-2 layers. Machine: shared 2-core "
            f"CPU box, NVMe path on its disk. Data: "
            + ", ".join(sorted({r['source'] for r in rows})) + ".")


def _ds_version(rows: list[dict]) -> str:
    for row in rows:
        for probe in row["probes"]:
            for rank in probe.get("ranks", []):
                if rank.get("deepspeed"):
                    return rank["deepspeed"]
    return "(version not recorded)"


def offload_capacity_figure(results: list[tuple[str, dict]]):
    """`results`: [(file name, loaded JSON), ...] of offload_capacity.py runs."""
    rows = settings(results)
    budget = rows[0]["config"]["budget_mib"]
    fig, axes = figure(13, max(5.2, 1.6 + 0.5 * len(rows)), caption(rows), ncols=2,
                       width_ratios=(1, 1.25))
    bars, probes = axes[0]
    for i, row in enumerate(rows):
        colour = row["colour"]
        ds = row["engine"] == "deepspeed"
        hatch = "xx" if ds else None if row["reuse"] is None else "//"
        big = row["largest"] or {}
        m = big.get("params", 0) / 1e6
        bars.barh(i, m, color=colour, hatch=hatch, edgecolor="white")
        if row["error"] and not big:
            text = f"{ENGINE_NAMES.get(row['engine'], row['engine'])}: {row['error']}"
            bars.text(3, i, "\n".join(textwrap.wrap(text, 60)[:3]), va="center", fontsize=6,
                      color="#d62728")
        else:
            bars.text(m + 3, i, f"{m:.0f}M ({big.get('layers', '?')} layers)", va="center",
                      fontsize=8)
        fits = sorted((p["params"] / 1e6, _peak(p)) for p in row["probes"] if p["fits"])
        style = "-." if ds else "-" if row["reuse"] is None else "--"
        probes.plot([x for x, _ in fits], [y for _, y in fits], style, marker="o",
                    color=colour, label=row["label"])
        fail = [p for p in row["probes"] if p["layers"] == row["failing"]]
        if fail:
            probes.plot([fail[0]["params"] / 1e6], [budget], "x", color=colour, ms=10, mew=2)
    bars.set_yticks(range(len(rows)), [r["tick"] for r in rows], fontsize=7)
    bars.invert_yaxis()
    bars.set_xlim(0, max((r["largest"] or {}).get("params", 0) for r in rows) / 1e6 * 1.35)
    bars.set_xlabel("parameters of the largest GPT that trains (millions)")
    bars.set_ylabel("engine, precision, offload mode, stage-3 reuse distance")
    bars.set_title(f"Largest model in {budget / 1024:.0f} GiB per rank", fontsize=10)
    plain = [r for r in rows if (r["engine"], r["precision"]) == ("zerolite", "fp32")]
    handles = [Patch(color=c, label=("fp32, " if len(plain) < len(rows) else "")
                     + label) for mode, (label, c) in MODES.items()
               if any(r["mode"] == mode for r in plain)]
    handles += [Patch(color=c, label=label) for p, (label, c, _) in PRECISIONS.items()
                if any(r["precision"] == p and r not in plain for r in rows)
                and not (p == "fp32" and any(r["mode"] == "none" for r in plain))]
    if any(r["reuse"] is not None for r in rows):
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="//",
                             label="hatched: stage3_max_reuse_distance 0"))
    if any(r["engine"] == "deepspeed" for r in rows):
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="xx",
                             label="cross-hatched: DeepSpeed"))
    bars.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15),
                ncols=2)
    probes.axhline(budget, color="black", ls=":", lw=1, label=f"budget {budget} MiB per rank")
    probes.set_xlabel("model parameters (millions)")
    probes.set_ylabel("peak RSS, larger rank (MiB)")
    probes.set_title("Every probe that fit; x = first depth that did not", fontsize=10)
    probes.grid(alpha=0.3)
    if len(rows) <= 6:
        probes.legend(fontsize=7, loc="upper left")
    else:  # colours as in the bars' legend; the line style tells the rest
        styles = [("-", "zerolite, DeepSpeed's default reuse distance", True),
                  ("--", "zerolite, reuse distance 0", any(r["reuse"] is not None for r in rows)),
                  ("-.", "DeepSpeed", any(r["engine"] == "deepspeed" for r in rows))]
        lines = [Line2D([], [], ls=ls, marker="o", color="#555555", label=label)
                 for ls, label, present in styles if present]
        lines.append(Line2D([], [], ls=":", color="black", label=f"budget {budget} MiB per rank"))
        probes.legend(handles=lines, fontsize=7, loc="upper left")
    fig.suptitle("Offload capacity: ZeRO-3 GPT under a per-rank memory budget", fontsize=12)
    return fig
