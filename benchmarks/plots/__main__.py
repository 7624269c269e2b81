"""Redraw every benchmark picture from the JSON results: ``python -m benchmarks.plots``
(``make plots``). Each PNG is written next to the JSON it is drawn from (or to --out)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.plots import save
from benchmarks.plots.bf16 import bf16_figure
from benchmarks.plots.masters import masters_figure
from benchmarks.plots.offload import offload_capacity_figure
from benchmarks.plots.peers import peers_figure
from benchmarks.plots.sparse import sparse_figure, study_figure
from benchmarks.plots.timeline import timeline_figure

RESULTS = Path(__file__).resolve().parents[1] / "results"
OFFLOAD_CAPACITY = ("offload_capacity.json", "offload_capacity_nvme_param.json",
                    "offload_capacity_reuse0.json", "offload_capacity_precision.json")
_OLD = "Superseded: measured with glibc's mmap threshold pinned for every engine. "
PEERS_NOTES = {  # what the JSON does not say about the run, for the caption
    "peers_matrix_20M.json": "Ran while five other jobs shared the 2 cores (load average "
                             "7-21): wall times swing 2x, compare CPU time. ",
    "peers_80M_issue16.json": "Ran on the shared machine: compare CPU time. ",
    "peers.json": _OLD,
    "peers_300M.json": _OLD,
}


def figures(results: Path = RESULTS):
    """(PNG name, Figure) of every picture whose JSON is in `results`, one at a time."""
    def load(name: str) -> dict:
        return json.loads((results / name).read_text())

    for path in sorted(results.glob("peers*.json")):
        yield path.stem + ".png", peers_figure(load(path.name), source=path.name,
                                               note=PEERS_NOTES.get(path.name, ""))
    for path in sorted(results.glob("timeline*.json")):
        yield path.stem + ".png", timeline_figure(load(path.name), source=path.name)
    present = [n for n in OFFLOAD_CAPACITY if (results / n).exists()]
    if present:
        yield "offload_capacity.png", offload_capacity_figure([(n, load(n)) for n in present])
    if (results / "bf16_study.json").exists():
        yield "bf16_study.png", bf16_figure(load("bf16_study.json"))
    for path in sorted(results.glob("sparse_grads*.json")):
        yield path.stem + ".png", sparse_figure(load(path.name), source=path.name)
    for path in sorted(results.glob("sparse_adam_study*.json")):
        yield path.stem + ".png", study_figure(load(path.name), source=path.name)
    for path in sorted(results.glob("bf16_masters*.json")):
        yield path.stem + ".png", masters_figure(load(path.name), source=path.name)


def redraw(results: Path = RESULTS, out: Path | None = None) -> list[Path]:
    """Draw every picture whose JSON is in `results`; returns the PNG paths written."""
    out = out or results
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures(results):
        save(fig, out / name)
        written.append(out / name)
    return written


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of JSON results")
    ap.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: "
                    "beside the JSON)")
    args = ap.parse_args(argv)
    for path in redraw(args.results, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
