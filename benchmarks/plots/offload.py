"""Offload capacity: the largest GPT that trains within a per-rank memory budget, by offload
mode and stage-3 reuse distance, from the JSON of benchmarks/offload_capacity.py.

Left: the largest model that fit (bars, labelled with its depth). Right: every probe's peak
RSS (the larger rank) against model size, one line per setting, the budget as a dashed line
and the first depth that did not fit as a cross on it.
"""
from __future__ import annotations

from matplotlib.patches import Patch

from benchmarks.plots import figure

MODES = {  # mode -> (legend label, colour)
    "none": ("no offload", "#7f7f7f"),
    "nvme": ("offload_optimizer: nvme", "#1f77b4"),
    "nvme+param": ("offload_optimizer + offload_param: nvme", "#9467bd"),
}


def settings(results: list[tuple[str, dict]]) -> list[dict]:
    """One row per (file, mode): label, mode, reuse distance, largest fit, probes."""
    rows = []
    for source, data in results:
        cfg = data["config"]
        reuse = cfg.get("reuse_distance")
        for mode, res in data.items():
            if mode in ("config", "note") or not isinstance(res, dict) or "probes" not in res:
                continue
            reuse_text = "DeepSpeed's default reuse distance" if reuse is None \
                else f"reuse distance {reuse}"
            rows.append({"mode": mode, "reuse": reuse, "source": source, "config": cfg,
                         "label": f"{MODES.get(mode, (mode,))[0]}, {reuse_text}",
                         "largest": res.get("largest"), "probes": res["probes"],
                         "failing": res.get("smallest_failing_layers")})
    return rows


def _peak(probe: dict) -> float | None:
    peaks = [r["peak_rss_mib"] for r in probe.get("ranks", []) if r.get("peak_rss_mib")]
    return max(peaks) if peaks else None


def caption(rows: list[dict]) -> str:
    cfg = rows[0]["config"]
    return (f"zerolite's GPT (d_model {cfg['d_model']}, vocab {cfg['vocab']}, seq {cfg['seq']}, "
            f"micro-batch {cfg['batch']} per rank) built under zero.Init, ZeRO-3, world "
            f"{cfg['world_size']}, {cfg['dtype']}, {cfg['optimizer']}, sub_group_size "
            f"{cfg['sub_group_size']:.0e}, {cfg['steps']} steps per probe; a probe fits when "
            f"both ranks finish with ru_maxrss <= {cfg['budget_mib']} MiB. Depth searched by "
            f"doubling then bisection; read the result as +-1-2 layers. Machine: shared 2-core "
            f"CPU box, NVMe path on its disk. Data: "
            + ", ".join(sorted({r['source'] for r in rows})) + ".")


def offload_capacity_figure(results: list[tuple[str, dict]]):
    """`results`: [(file name, loaded JSON), ...] of offload_capacity.py runs."""
    rows = settings(results)
    budget = rows[0]["config"]["budget_mib"]
    fig, axes = figure(13, 5.2, caption(rows), ncols=2, width_ratios=(1, 1.25))
    bars, probes = axes[0]
    for i, row in enumerate(rows):
        colour = MODES.get(row["mode"], (row["mode"], "#333333"))[1]
        hatch = None if row["reuse"] is None else "//"
        big = row["largest"] or {}
        m = big.get("params", 0) / 1e6
        bars.barh(i, m, color=colour, hatch=hatch, edgecolor="white")
        bars.text(m + 3, i, f"{m:.0f}M ({big.get('layers', '?')} layers)", va="center",
                  fontsize=8)
        fits = sorted((p["params"] / 1e6, _peak(p)) for p in row["probes"] if p["fits"])
        style = "-" if row["reuse"] is None else "--"
        probes.plot([x for x, _ in fits], [y for _, y in fits], style, marker="o",
                    color=colour, label=row["label"])
        fail = [p for p in row["probes"] if p["layers"] == row["failing"]]
        if fail:
            probes.plot([fail[0]["params"] / 1e6], [budget], "x", color=colour, ms=10, mew=2)
    bars.set_yticks(range(len(rows)), [r["label"].replace(", ", "\n") for r in rows], fontsize=7)
    bars.invert_yaxis()
    bars.set_xlim(0, max((r["largest"] or {}).get("params", 0) for r in rows) / 1e6 * 1.35)
    bars.set_xlabel("parameters of the largest GPT that trains (millions)")
    bars.set_ylabel("offload mode, stage-3 reuse distance")
    bars.set_title(f"Largest model in {budget / 1024:.0f} GiB per rank", fontsize=10)
    handles = [Patch(color=c, label=label) for mode, (label, c) in MODES.items()
               if any(r["mode"] == mode for r in rows)]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="//",
                         label="hatched: stage3_max_reuse_distance 0"))
    bars.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15),
                ncols=2)
    probes.axhline(budget, color="black", ls=":", lw=1, label=f"budget {budget} MiB per rank")
    probes.set_xlabel("model parameters (millions)")
    probes.set_ylabel("peak RSS, larger rank (MiB)")
    probes.set_title("Every probe that fit; x = first depth that did not", fontsize=10)
    probes.grid(alpha=0.3)
    probes.legend(fontsize=7, loc="upper left")
    fig.suptitle("Offload capacity: ZeRO-3 GPT under a per-rank memory budget", fontsize=12)
    return fig
