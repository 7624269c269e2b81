"""One engine on one workload, inside each torchrun rank; rank 0 writes the JSON.

python -m torch.distributed.run --standalone --nproc_per_node W -m benchmarks.peers.worker \
    --engine zerolite3 --size 20M --dtype fp32 --config tuned --gas 1 --steps 6 --warmup 2 \
    --out FILE.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import threading
import time

import psutil
import torch
import torch.distributed as dist

from benchmarks.peers import configs as C
from benchmarks.peers import engines as E
from benchmarks.peers import wire_count
from benchmarks.peers import workload as W


class RssSampler:
    """Peak resident set size while training (psutil, every `interval` s)."""

    def __init__(self, interval: float = 0.01):
        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True, choices=E.ENGINES)
    ap.add_argument("--size", required=True, choices=list(W.SIZES))
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--config", default="tuned", choices=C.CONFIGS)
    ap.add_argument("--gas", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    # Note: no allocator setting here; every engine runs as its users run it. Counting the
    # bytes of Python collectives is a measurement, the same for every engine.
    wire_count.install()
    E.init_process_group(args.engine)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    size = W.SIZES[args.size]
    rss_start = psutil.Process().memory_info().rss
    model = W.build_model(size)
    n_params = sum(p.numel() for p in model.parameters())
    if size.global_batch % (world * args.gas):
        raise SystemExit(f"global batch {size.global_batch} does not split into world {world} "
                         f"x gas {args.gas} micro-batches")
    engine = E.build(args.engine, model, size, args.dtype, world, config=args.config,
                     gas=args.gas)
    del model
    rss_init = psutil.Process().memory_info().rss
    batches = W.global_batches(size, args.warmup + args.steps)

    times, cpu_times, losses, comms, sent = [], [], [], [], []
    load_before = os.getloadavg()[0]
    with RssSampler() as rss:
        for i, batch in enumerate(batches):
            x, y = W.rank_slice(batch, rank, world)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            b0 = wire_count.SENT["bytes"]
            loss = engine.step(x, y)
            db = wire_count.SENT["bytes"] - b0 + engine.extra_bytes()
            dist.barrier()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            total = torch.tensor(loss.item(), dtype=torch.float64)
            dist.all_reduce(total)  # untimed: mean of the ranks' losses = global-batch loss
            losses.append(total.item() / world)
            if i >= args.warmup:
                times.append(dt)
                cpu_times.append(dc)
                sent.append(db)
                comms.append(engine.comm())
    mine = {"rank": rank, "peak_rss_mib": rss.peak / 2**20,
            "rss_after_init_mib": rss_init / 2**20, "rss_before_model_mib": rss_start / 2**20,
            "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_times_s": times, "cpu_times_s": cpu_times, "comm": comms,
            "bytes_sent": sent,
            "loadavg_1m": [load_before, os.getloadavg()[0]]}
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mine)
    if rank == 0:
        comm = None
        if comms and comms[0] is not None:
            # median over steps of the slowest rank's value (the step waits for it)
            comm = {k: statistics.median(max(r["comm"][s][k] for r in per_rank)
                                         for s in range(len(times)))
                    for k in comms[0]}
        step_max = [max(r["step_times_s"][s] for r in per_rank) for s in range(len(times))]
        med = statistics.median(step_max)
        out = {"engine": args.engine, "size": args.size, "dtype": args.dtype, "world": world,
               "config": args.config, "gas": args.gas,
               "params": n_params, "global_batch": size.global_batch,
               "micro_batch": size.global_batch // world // args.gas, "seq_len": W.SEQ_LEN,
               "bytes_sent_per_step": statistics.median(
                   max(r["bytes_sent"][s] for r in per_rank) for s in range(len(times))),
               "steps": args.steps, "warmup": args.warmup, "threads_per_rank":
               torch.get_num_threads(), "median_step_s": med,
               "samples_per_s": size.global_batch / med, "step_times_s": step_max,
               "peak_rss_mib_per_rank": [r["peak_rss_mib"] for r in per_rank],
               "peak_rss_mib": max(r["peak_rss_mib"] for r in per_rank),
               "rss_after_init_mib_per_rank": [r["rss_after_init_mib"] for r in per_rank],
               "ru_maxrss_mib_per_rank": [r["ru_maxrss_mib"] for r in per_rank],
               "cpu_s_per_step": statistics.median(
                   max(r["cpu_times_s"][s] for r in per_rank) for s in range(len(times))),
               "loadavg_1m_before_after": per_rank[0]["loadavg_1m"],
               "comm": comm, "exposed_comm_s": comm["exposed_s"] if comm else None,
               "losses": losses, "notes": engine.notes}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.out)
    # Note: drop the engine (DDP's C++ reducer, FSDP2's hooks, DeepSpeed's engine) before the
    # process group it holds is destroyed, not at interpreter exit after it.
    del engine
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
