"""One ZeRO-3 training step of one rank: compute and communication lanes over time.

Drawn from the Chrome trace that benchmarks/timeline.py writes (``traceEvents``: one complete
event per span, ``tid`` = lane, ``pid`` = rank; ``otherData`` = the run's settings). Lanes, top
to bottom: compute (forward / backward of each unit), all-gathers in flight, compute blocked
waiting for a gather, gradient reductions in flight. Time is in milliseconds from the first
event of the step.
"""
from __future__ import annotations

from matplotlib.patches import Patch

from benchmarks.plots import figure, machine_text

LANES = (  # tid, y-axis label
    ("compute", "compute\n(forward / backward)"),
    ("all_gather", "all-gather\nin flight"),
    ("wait", "compute blocked\non a gather"),
    ("reduce", "gradient reduction\nin flight"),
)
KINDS = {  # legend label, colour
    "forward": ("forward compute", "#4285f4"),
    "backward": ("backward compute", "#34a853"),
    "all_gather": ("parameter all-gather", "#fb8c00"),
    "wait": ("blocked on a gather", "#db4437"),
    "reduce": ("gradient reduce-scatter", "#8e44ad"),
}


def _kind(lane: str, name: str) -> str:
    if lane == "compute":
        return "forward" if name.startswith("forward") else "backward"
    return lane if lane in KINDS else "reduce"


def trace_from_events(events, rank: int = 0, other: dict | None = None) -> dict:
    """A Chrome trace dict from StepStats events [(lane, name, start_s, end_s), ...]."""
    lanes = {"compute": "compute", "wait": "wait"}
    out = []
    for lane, name, start, end in events:
        tid = lanes.get(lane) or ("all_gather" if name.startswith("all_gather") else "reduce")
        out.append({"name": name, "ph": "X", "ts": start * 1e6, "dur": (end - start) * 1e6,
                    "pid": rank, "tid": tid})
    return {"traceEvents": out, "otherData": dict(other or {})}


def caption(other: dict, source: str) -> str:
    if not other:
        return f"Settings not recorded in the trace. Data: {source}."
    return (f"{other.get('size', '?')} GPT, world {other.get('world', '?')}, "
            f"{other.get('dtype', '?')}, micro-batch {other.get('micro', '?')}, ZeRO-3 with "
            f"reuse distance 0 and persistence 0 (every unit gathered in forward and again in "
            f"backward), prefetch {other.get('prefetch', '?')}; the last of "
            f"{other.get('steps', '?')} steps, rank {other.get('rank', 0)}. Machine: "
            f"{machine_text(other.get('machine'))}. Command: {other.get('command', '?')}. "
            f"Data: {source} (open it in ui.perfetto.dev for every rank).")


def timeline_figure(trace: dict, rank: int = 0, source: str = "timeline.json"):
    """Lanes of one rank's step from a Chrome trace dict (as loaded from JSON)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == rank]
    if not events:
        raise ValueError(f"no events of rank {rank} in the trace")
    other = {**trace.get("otherData", {}), "rank": rank}
    t0 = min(e["ts"] for e in events)
    fig, axes = figure(12, 3.6, caption(other, source))
    ax = axes[0, 0]
    rows = [tid for tid, _ in LANES]
    for e in events:
        row = rows.index(e["tid"]) if e["tid"] in rows else rows.index("reduce")
        kind = _kind(e["tid"], e["name"])
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.05))],
                       (len(rows) - 1 - row - 0.38, 0.76), facecolors=KINDS[kind][1],
                       edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(len(rows)), [label for _, label in reversed(LANES)], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(left=0)
    ax.set_xlabel("time since the step's first event (ms)")
    ax.set_ylabel("lane")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(handles=[Patch(color=c, label=label) for label, c in KINDS.values()],
              loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=8, title="span", title_fontsize=8)
    ax.set_title(f"One ZeRO-3 step on rank {rank}: prefetch {other.get('prefetch', '?')}",
                 fontsize=11)
    return fig
