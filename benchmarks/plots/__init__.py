"""The benchmark pictures, drawn with matplotlib from the JSON results in benchmarks/results/.

    python -m benchmarks.plots                 # redraw every picture (make plots)
    python -m benchmarks.plots --out /tmp/p    # somewhere else

One module per picture, each with a ``*_figure(data) -> Figure`` function that takes the saved
JSON (as loaded) and returns the figure, so the runners that measure (benchmarks/peers/run.py,
benchmarks/timeline.py) and ``python -m benchmarks.plots`` draw the same thing. Every figure has
a title, labelled axes (with units), a legend and a caption naming the workload, the machine
and the JSON it was drawn from. Only matplotlib is needed (``pip install -e .[bench]``); the
Agg backend is used, so no display is required.
"""
from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

ENGINES = {  # key in the results -> (legend label, colour)
    "zerolite3": ("zerolite ZeRO-3", "#1f77b4"),
    "zerolite3_once": ("zerolite ZeRO-3, reduce once per step", "#17becf"),
    "zerolite2": ("zerolite ZeRO-2", "#72b1e6"),
    "deepspeed": ("DeepSpeed ZeRO-3", "#d62728"),
    "fsdp2": ("PyTorch FSDP2", "#ff7f0e"),
    "ddp": ("PyTorch DDP", "#2ca02c"),
}


def machine_text(machine: dict | None) -> str:
    """'AMD EPYC, 2 cores, 23.5 GiB, torch 2.13.0+cpu' from a results' "machine" entry."""
    if not machine:
        return "machine not recorded"
    parts = [machine.get("cpu"), f"{machine['cores']} cores" if machine.get("cores") else None,
             f"{machine['mem_gib']} GiB" if machine.get("mem_gib") else None,
             f"torch {machine['torch']}" if machine.get("torch") else None]
    return ", ".join(p for p in parts if p)


def figure(width: float, height: float, caption: str, nrows: int = 1, ncols: int = 1,
           **kw):
    """A figure laid out by matplotlib's constrained layout, with the caption (wrapped to the
    width) under the axes; returns (fig, axes as a 2-D array)."""
    lines = textwrap.wrap(caption, width=int(width * 16)) if caption else []
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height + 0.16 * len(lines)),
                             squeeze=False, layout="constrained", **kw)
    if lines:
        fig.supxlabel("\n".join(lines), x=0.01, ha="left", fontsize=8, color="#333333")
    return fig, axes


def save(fig, path) -> None:
    """Write the figure as PNG and close it."""
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
