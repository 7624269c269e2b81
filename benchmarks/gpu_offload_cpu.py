"""Device memory and step time with offload_optimizer / offload_param "cpu" vs none, on CUDA.

    python benchmarks/gpu_offload_cpu.py --out benchmarks/results/gpu_check/offload_cpu.json

World 1 (NCCL), ZeRO-3, bf16, the 80M GPT (benchmarks/step_workloads.py). Per mode: peak
device bytes allocated over the measured steps (torch.cuda.max_memory_allocated), the
model-state bytes the engine reports on the device and in host memory (memory_stats), and
the median synchronized step time. Ratios are against "none" in the same run. gpu_check.py
runs it; without CUDA it says so and exits 0.
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

PINNED = {"device": "cpu", "pin_memory": True}
MODES = {"none": (None, None), "cpu": ({"device": "cpu"}, None), "cpu-pinned": (PINNED, None),
         "cpu-pinned+param": (PINNED, PINNED), "cpu-ratio0.5": ({"device": "cpu", "ratio": 0.5},
                                                                None)}


def _worker(rank, world, mode, micro, steps, warmup):
    import zerolite
    from step_workloads import GPT_80M
    from zerolite.models import GPT

    torch.manual_seed(0)
    offload, param = MODES[mode]
    zo = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}
    if offload:
        zo["offload_optimizer"] = offload
    if param:
        zo["offload_param"] = param
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "bf16": {"enabled": True},
              "zero_optimization": zo}
    engine, *_ = zerolite.initialize(model=GPT(GPT_80M), config=config)
    g = torch.Generator().manual_seed(rank)
    data = torch.randint(0, GPT_80M.vocab_size, (micro, GPT_80M.seq_len + 1), generator=g)
    x, y = data[:, :-1].to(engine.device), data[:, 1:].to(engine.device)
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    ms = engine.memory_stats()
    host = ms["host"].get("total", 0)
    state = ms["param_shards"] + ms["master_shards"] + ms["optimizer_state"]
    return {"mode": mode, "median_step_s": statistics.median(times),
            "peak_device_bytes": torch.cuda.max_memory_allocated(),
            "device_model_state_bytes": state - ms["host"].get("masters", 0)
            - ms["host"].get("optimizer_state", 0) - ms["host"].get("param_shards", 0),
            "host_model_state_bytes": host, "loss": loss.item()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="none,cpu-pinned,cpu-pinned+param")
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/gpu_check/offload_cpu.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_offload_cpu: needs a CUDA device; nothing measured")
        return 0
    from zerolite.testing.multiprocess import run_ranks

    rows = [run_ranks(_worker, 1, mode, args.micro, args.steps, args.warmup, timeout_s=300)[0]
            for mode in args.modes.split(",")]
    base = next((r for r in rows if r["mode"] == "none"), None)
    lines = ["| mode | peak device MiB | x none | device model state MiB | host MiB | "
             "step ms | x none |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = r["peak_device_bytes"] / base["peak_device_bytes"] if base else float("nan")
        step = r["median_step_s"] / base["median_step_s"] if base else float("nan")
        r.update(peak_vs_none=mem, step_vs_none=step)
        lines.append(f"| {r['mode']} | {r['peak_device_bytes'] / 2**20:.0f} | {mem:.2f} | "
                     f"{r['device_model_state_bytes'] / 2**20:.0f} | "
                     f"{r['host_model_state_bytes'] / 2**20:.0f} | "
                     f"{r['median_step_s'] * 1e3:.1f} | {step:.2f} |")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
