"""Which reduce-scatter is fastest on gloo here: all-reduce + slice, reduce_scatter, or
all_to_all + local sum? One flat fp32 gradient of a unit, ranks forked on 127.0.0.1.

    python benchmarks/gloo_reduce_bench.py [--worlds 2,4] [--mib 7,50] [--reps 8]
        [--out benchmarks/results/gloo_reduce.json]

Per method: median wall time from issue to the averaged shard (`end_s`), the part of it the
caller is blocked inside the launching call (`issue_s`: gloo's reduce_scatter copies
synchronously), CPU-seconds of the process per reduction (all threads, gloo's included), and
the bytes each rank sends by the algorithm (ring all-reduce 2(N-1)/N of the buffer,
reduce-scatter and all_to_all (N-1)/N).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zerolite.testing.multiprocess import run_ranks

METHODS = ("all_reduce", "reduce_scatter", "all_to_all")
_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _once(method: str, full: torch.Tensor, recv: torch.Tensor, world: int, rank: int):
    n = full.numel() // world
    t0 = time.perf_counter()
    if method == "all_reduce":
        work = dist.all_reduce(full, async_op=True)
        t1 = time.perf_counter()
        work.wait()
        shard = full[rank * n:(rank + 1) * n].clone()
    elif method == "reduce_scatter":
        shard = torch.empty(n)
        work = _rs(shard, full, async_op=True)
        t1 = time.perf_counter()
        work.wait()
    else:
        work = dist.all_to_all_single(recv, full, async_op=True)
        t1 = time.perf_counter()
        work.wait()
        shard = recv.view(world, n).sum(0)
    shard.mul_(1.0 / world)
    return t1 - t0, time.perf_counter() - t0, shard


def _bench(rank, world, numel: int, reps: int) -> dict:
    numel -= numel % world
    base = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    recv = torch.empty(numel)
    out = {}
    for method in METHODS:
        issue, end, cpu = [], [], []
        for i in range(reps + 2):
            full = base.clone()
            dist.barrier()
            c0 = time.process_time()
            a, b, shard = _once(method, full, recv, world, rank)
            dist.barrier()
            if i >= 2:
                issue.append(a)
                end.append(b)
                cpu.append(time.process_time() - c0)
        out[method] = {"issue_s": statistics.median(issue), "end_s": statistics.median(end),
                       "cpu_s": statistics.median(cpu), "shard_sum": float(shard.sum())}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--mib", default="7,50")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gloo_reduce.json"))
    args = ap.parse_args(argv)
    rows = []
    for world in [int(w) for w in args.worlds.split(",")]:
        for mib in [float(m) for m in args.mib.split(",")]:
            numel = int(mib * 2**20 / 4)
            per_rank = run_ranks(_bench, world, numel, args.reps, timeout_s=900)
            for method in METHODS:
                r = {k: max(p[method][k] for p in per_rank) for k in ("issue_s", "end_s", "cpu_s")}
                factor = 2 * (world - 1) / world if method == "all_reduce" else (world - 1) / world
                r.update(world=world, mib=mib, method=method,
                         bytes_sent_per_rank=int(factor * numel * 4))
                rows.append(r)
                print(f"[gloo] world {world} {mib:g} MiB {method:14s} end {r['end_s'] * 1e3:7.1f} ms"
                      f"  blocked in issue {r['issue_s'] * 1e3:6.1f} ms  cpu {r['cpu_s'] * 1e3:6.1f} ms"
                      f"  sent {r['bytes_sent_per_rank'] / 2**20:6.1f} MiB", flush=True)
            sums = {m: [p[m]["shard_sum"] for p in per_rank] for m in METHODS}
            for m in METHODS:  # every method computes the same shards (fp32 rounding)
                for a, b in zip(sums[m], sums["reduce_scatter"]):
                    assert abs(a - b) <= 1e-3 * max(1.0, abs(b)), (m, a, b)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=1))
    return {"rows": rows}


if __name__ == "__main__":
    main()
