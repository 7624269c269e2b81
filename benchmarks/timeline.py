"""Render one ZeRO-3 training step's timeline: compute vs communication lanes.

    .venv/bin/python benchmarks/timeline.py --prefetch on --out benchmarks/results/timeline_on
    .venv/bin/python benchmarks/timeline.py --prefetch off --out benchmarks/results/timeline_off

Writes OUT.json (Chrome trace: open in chrome://tracing or https://ui.perfetto.dev; the run's
settings under "otherData") and OUT.png, drawn by benchmarks/plots/timeline.py (rank 0; lanes
top to bottom: compute [forward, backward], all-gathers in flight, compute blocked on a gather,
reductions in flight; time in ms). `python -m benchmarks.plots` redraws the PNG from the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmarks.peers.workload import machine_info  # noqa: E402
from benchmarks.plots import save  # noqa: E402
from benchmarks.plots.timeline import timeline_figure, trace_from_events  # noqa: E402
from step_workloads import GPT_20M, GPT_80M, _batch  # noqa: E402


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


def render(events, path_png: str, other: dict | None = None) -> None:
    """Draw rank 0's StepStats events [(lane, name, start_s, end_s), ...] as OUT.png."""
    save(timeline_figure(trace_from_events(events, 0, other),
                         source=os.path.basename(path_png)[:-4] + ".json"), path_png)


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
    other = {"size": args.size, "world": args.world, "dtype": args.dtype, "micro": args.micro,
             "steps": args.steps, "prefetch": args.prefetch, "machine": machine_info(),
             "command": "python benchmarks/timeline.py " + " ".join(argv or sys.argv[1:])}
    trace = {"traceEvents": [e for rank, (events, _) in enumerate(results)
                             for e in trace_from_events(events, rank)["traceEvents"]],
             "otherData": other}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(trace, f)
    save(timeline_figure(trace, source=os.path.basename(args.out) + ".json"), args.out + ".png")
    stats = results[0][1]
    print(f"wrote {args.out}.json and {args.out}.png; rank 0: all-gather {stats['all_gather_s']:.3f}s, "
          f"exposed {stats['all_gather_wait_s']:.3f}s, reduce {stats['reduce_scatter_s']:.3f}s "
          f"(exposed {stats['reduce_scatter_wait_s']:.3f}s)")


if __name__ == "__main__":
    main()
