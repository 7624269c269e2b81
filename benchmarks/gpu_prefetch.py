"""ZeRO-3 step time with prefetch off vs on, on CUDA, with a profiler trace and timeline.

    python benchmarks/gpu_prefetch.py --out benchmarks/results/gpu_check/prefetch

Per world size (1: NCCL; 2: two ranks sharing one GPU on gloo, as `harness_mode` picks)
and prefetch setting: median step time (synchronized), the gather-stream time and the
exposed wait (compute stalled) per step from StepStats -- CUDA events, not host clocks --
and "exposed / all-gather (off)": exposed time with prefetch on over the gather-stream
time of the same configuration with prefetch off. For world 1 with prefetch on it also
writes one step's torch.profiler trace (OUT_trace.json: CPU ops and both CUDA side
streams) and the StepStats timeline (OUT_timeline.{json,png}, see benchmarks/timeline.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

PREFETCH = {"off": 0, "on": 1}


def _worker(rank, world, size, prefetch, micro, steps, warmup, trace_prefix):
    import zerolite
    from step_workloads import GPT_20M, GPT_80M
    from zerolite.models import GPT

    cfg = {"20M": GPT_20M, "80M": GPT_80M}[size]
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_reuse_distance": 0,
                                    "stage3_prefetch_bucket_size": PREFETCH[prefetch]}}
    engine, *_ = zerolite.initialize(model=GPT(cfg), config=config)
    g = torch.Generator().manual_seed(rank)
    data = torch.randint(0, cfg.vocab_size, (micro, cfg.seq_len + 1), generator=g)
    x, y = data[:, :-1].to(engine.device), data[:, 1:].to(engine.device)

    def step():
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

    times, stats = [], []
    for i in range(warmup + steps):
        torch.distributed.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            stats.append(engine.last_step_stats.as_dict())
    events = None
    if trace_prefix and rank == 0:
        from torch.profiler import ProfilerActivity, profile

        engine.sharded.stats.trace = True
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(trace_prefix + "_trace.json")
        events = engine.last_step_stats.events
    return {"median_step_s": statistics.median(times), "stats": stats, "events": events,
            "memory": engine.device_layer.memory_stats()}


def summarize(rows: list[dict]) -> list[dict]:
    """Add exposed / all-gather(off) to each row (same world and size)."""
    off = {(r["world"], r["size"]): r for r in rows if r["prefetch"] == "off"}
    for r in rows:
        base = off.get((r["world"], r["size"]))
        gather_off = base["all_gather_s"] if base else 0.0
        r["exposed_vs_gather_off"] = r["exposed_s"] / gather_off if gather_off else None
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| world | size | prefetch | median step ms | all-gather ms/step | exposed ms/step "
             "| exposed / all-gather (off) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        frac = f"{r['exposed_vs_gather_off']:.0%}" if r["exposed_vs_gather_off"] is not None \
            else "n/a"
        lines.append(f"| {r['world']} | {r['size']} | {r['prefetch']} | "
                     f"{r['median_step_s'] * 1e3:.1f} | {r['all_gather_s'] * 1e3:.2f} | "
                     f"{r['exposed_s'] * 1e3:.2f} | {frac} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="1,2")
    p.add_argument("--size", choices=["20M", "80M"], default="80M")
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/gpu_check/prefetch")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_prefetch: needs a CUDA device; nothing measured")
        return 0
    from timeline import render, trace_from_events

    from zerolite.testing.multiprocess import run_ranks

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for prefetch in ("off", "on"):
            trace = args.out if (world == 1 and prefetch == "on") else None
            res = run_ranks(_worker, world, args.size, prefetch, args.micro, args.steps,
                            args.warmup, trace, timeout_s=300)
            stats = [s for r in res for s in r["stats"]]
            rows.append({"world": world, "size": args.size, "prefetch": prefetch,
                         "median_step_s": max(r["median_step_s"] for r in res),
                         "all_gather_s": statistics.mean(s["all_gather_stream_s"] for s in stats),
                         "exposed_s": statistics.mean(s["all_gather_wait_s"] for s in stats),
                         "memory_rank0": res[0]["memory"]})
            if res[0]["events"]:
                other = {"size": args.size, "world": world, "dtype": "fp32",
                         "micro": args.micro, "steps": args.steps + args.warmup,
                         "prefetch": prefetch, "command": "benchmarks/gpu_prefetch.py"}
                with open(args.out + "_timeline.json", "w") as f:
                    json.dump(trace_from_events(res[0]["events"], 0, other), f)
                render(res[0]["events"], args.out + "_timeline.png", other)
    summarize(rows)
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
