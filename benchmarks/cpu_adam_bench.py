"""AdamW step time on one fp32 flat shard: torch's three CPU implementations, the optimizer
zerolite's builder gives the engine, and DeepSpeed's DeepSpeedCPUAdam.

Each engine runs in its own interpreter: the torch ones and zerolite's in this Python,
DeepSpeed's in $DS_PYTHON (default /work/venv-ds/bin/python, whose cpu_adam op JIT-builds on
first use). Every (implementation, size, threads) cell is a fresh process: the same
hyper-parameters (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01, AdamW), the
thread count its users get by default (torch: one per core; DeepSpeed's OpenMP loop: one per
CPU) and 1 thread. Reported: the median of --steps timed steps after --warmup untimed ones,
and each implementation's ratio to the for-loop in the same run. It also measures how far the
fused and foreach updates drift from the for-loop one (max |diff| over 10 steps).

    PYTHONPATH=. python benchmarks/cpu_adam_bench.py --out benchmarks/results/cpu_adam.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HP = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
DS_PYTHON = os.environ.get("DS_PYTHON", "/work/venv-ds/bin/python")
TORCH_IMPLS = ("forloop", "foreach", "fused", "zerolite")


def _make(impl: str, p):
    import torch

    if impl == "zerolite":
        from zerolite.optim.builder import build_optimizer

        params = {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                  "weight_decay": HP["weight_decay"]}
        return build_optimizer("AdamW", params, None, [{"params": [p]}])
    if impl == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam([p], adamw_mode=True, **HP)
    flags = {"forloop": {"foreach": False}, "foreach": {"foreach": True},
             "fused": {"fused": True}}[impl]
    return torch.optim.AdamW([p], **HP, **flags)


def _describe(opt) -> str:
    """Which torch code path an optimizer's step takes."""
    d = opt.defaults
    if type(opt).__module__.startswith("deepspeed"):
        return type(opt).__name__
    if d.get("fused"):
        return f"{type(opt).__name__}(fused=True)"
    if d.get("foreach"):
        return f"{type(opt).__name__}(foreach=True)"
    # Note: foreach=None on CPU tensors falls back to the single-tensor for-loop in torch.
    return f"{type(opt).__name__}(foreach={d.get('foreach')}) -> for-loop on CPU"


def _time_one(impl: str, numel: int, threads: int | None, warmup: int, steps: int) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(numel, generator=g))
    p.grad = torch.randn(numel, generator=g) * 1e-2
    opt = _make(impl, p)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return {"impl": impl, "numel": numel, "threads": torch.get_num_threads(),
            "default_threads": threads is None, "optimizer": _describe(opt),
            "median_s": statistics.median(times), "min_s": min(times), "times_s": times}


def _drift(numel: int = 1 << 20, steps: int = 10) -> dict:
    """Max |param diff| and |exp_avg_sq diff| of fused / foreach vs the for-loop."""
    import torch

    ref = None
    out = {}
    for impl in ("forloop", "foreach", "fused"):
        g = torch.Generator().manual_seed(1)
        p = torch.nn.Parameter(torch.randn(numel, generator=g))
        opt = _make(impl, p)
        for _ in range(steps):
            p.grad = torch.randn(numel, generator=g) * 1e-2
            opt.step()
        got = (p.detach().clone(), opt.state[p]["exp_avg_sq"].clone())
        if ref is None:
            ref = got
            continue
        out[impl] = {"max_abs_param_diff": (got[0] - ref[0]).abs().max().item(),
                     "params_bitwise_equal": bool(torch.equal(got[0], ref[0])),
                     "max_abs_exp_avg_sq_diff": (got[1] - ref[1]).abs().max().item(),
                     "max_abs_param": ref[0].abs().max().item()}
    return {"numel": numel, "steps": steps, "vs_forloop": out}


def _child(python: str, impl: str, numel: int, threads: int | None, args) -> dict:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # DeepSpeed's cpu_adam loop is OpenMP
    cmd = [python, os.path.abspath(__file__), "--worker", impl, str(numel),
           str(threads or 0), str(args.warmup), str(args.steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        return {"impl": impl, "numel": numel, "threads": threads, "error":
                (r.stderr or r.stdout).strip().splitlines()[-30:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10e6,50e6,100e6")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/cpu_adam.json")
    ap.add_argument("--worker", nargs=5, metavar=("IMPL", "NUMEL", "THREADS", "WARMUP", "STEPS"))
    ap.add_argument("--drift", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        impl, numel, threads, warmup, steps = args.worker
        print(json.dumps(_time_one(impl, int(numel), int(threads) or None, int(warmup),
                                   int(steps))))
        return
    if args.drift:
        print(json.dumps(_drift()))
        return
    impls = [(sys.executable, i) for i in TORCH_IMPLS]
    if not args.no_deepspeed:
        impls.append((DS_PYTHON, "deepspeed"))
    rows = []
    for numel in [int(float(s)) for s in args.sizes.split(",")]:
        for threads in (None, 1):
            cell = {}
            for python, impl in impls:
                row = _child(python, impl, numel, threads, args)
                rows.append(row)
                cell[impl] = row
                print(json.dumps({k: v for k, v in row.items() if k != "times_s"}), flush=True)
            base = cell["forloop"].get("median_s")
            for row in cell.values():
                if base and "median_s" in row:
                    row["speedup_vs_forloop"] = base / row["median_s"]
    drift = subprocess.run([sys.executable, os.path.abspath(__file__), "--drift"],
                           capture_output=True, text=True, check=True)
    result = {"what": "AdamW step on one fp32 flat shard (param, grad, 2 moments)",
              "hyper_parameters": {**HP, "betas": list(HP["betas"])},
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "note": "shared 2-core machine: other engineers' jobs ran meanwhile; read ratios",
              "rows": rows, "drift": json.loads(drift.stdout.strip().splitlines()[-1])}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["drift"]))


if __name__ == "__main__":
    main()
