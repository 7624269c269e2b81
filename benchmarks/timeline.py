"""Render one ZeRO-3 training step's timeline: compute vs communication lanes.

    .venv/bin/python benchmarks/timeline.py --prefetch on --out benchmarks/results/timeline_on
    .venv/bin/python benchmarks/timeline.py --prefetch off --out benchmarks/results/timeline_off

Writes OUT.json (Chrome trace: open in chrome://tracing or https://ui.perfetto.dev) and
OUT.png (rank 0; lanes top to bottom: compute [forward blue, backward green], all-gathers
in flight [orange], compute blocked on a gather [red], reduce-scatters [purple]).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers.png import Canvas  # noqa: E402
from step_workloads import GPT_20M, GPT_80M, _batch  # noqa: E402

LANES = ["compute", "all_gather", "wait", "reduce"]
COLORS = {"forward": (66, 133, 244), "backward": (52, 168, 83), "all_gather": (251, 140, 0),
          "wait": (219, 68, 55), "reduce": (142, 68, 173)}


def _lane(lane: str, name: str) -> tuple[str, tuple]:
    if lane == "compute":
        return "compute", COLORS["forward" if name.startswith("forward") else "backward"]
    if name.startswith("all_gather"):
        return "all_gather", COLORS["all_gather"]
    if lane == "wait":
        return "wait", COLORS["wait"]
    return "reduce", COLORS["reduce"]


def _worker(rank, world, size, prefetch, dtype, micro, steps):
    import zerolite
    from zerolite.models import GPT

    cfg = {"20M": GPT_20M, "80M": GPT_80M}[size]
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "bf16": {"enabled": dtype == "bf16"},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_reuse_distance": 0,
                                    "stage3_prefetch_bucket_size": 10**9 if prefetch else 0}}
    engine, *_ = zerolite.initialize(model=GPT(cfg), config=config)
    engine.sharded.stats.trace = True
    for i in range(steps):
        x, y = _batch(cfg, micro, i, rank)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
    return engine.last_step_stats.events, engine.last_step_stats.as_dict()


def render(events, path_png: str, width: int = 1600, lane_h: int = 36) -> None:
    t0 = min(e[2] for e in events)
    t1 = max(e[3] for e in events)
    scale = (width - 20) / max(t1 - t0, 1e-9)
    canvas = Canvas(width, lane_h * len(LANES) + 20)
    for i in range(len(LANES)):  # lane backgrounds
        canvas.rect(10, 10 + i * lane_h, width - 10, 10 + (i + 1) * lane_h - 4, (242, 242, 242))
    for lane, name, start, end in events:
        row, color = _lane(lane, name)
        y = 10 + LANES.index(row) * lane_h
        x0 = 10 + int((start - t0) * scale)
        canvas.rect(x0, y + 2, max(x0 + 1, 10 + int((end - t0) * scale)), y + lane_h - 6, color)
    canvas.save(path_png)


def main(argv=None):
    from zerolite.testing.multiprocess import run_ranks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=["20M", "80M"], default="20M")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--prefetch", choices=["on", "off"], default="on")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/timeline")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = run_ranks(_worker, args.world, args.size, args.prefetch == "on", args.dtype,
                        args.micro, args.steps, timeout_s=1800)
    trace = {"traceEvents": [
        {"name": name, "ph": "X", "ts": start * 1e6, "dur": (end - start) * 1e6, "pid": rank,
         "tid": _lane(lane, name)[0]}
        for rank, (events, _) in enumerate(results) for lane, name, start, end in events]}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(trace, f)
    render(results[0][0], args.out + ".png")
    stats = results[0][1]
    print(f"wrote {args.out}.json and {args.out}.png; rank 0: all-gather {stats['all_gather_s']:.3f}s, "
          f"exposed {stats['all_gather_wait_s']:.3f}s, reduce {stats['reduce_scatter_s']:.3f}s "
          f"(exposed {stats['reduce_scatter_wait_s']:.3f}s)")


if __name__ == "__main__":
    main()
