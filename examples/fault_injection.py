"""Tiny ZeRO-3 training run that can make one rank fail on purpose (fail-fast checks).

    zerolite --num_procs 2 examples/fault_injection.py                       # trains, exits 0
    zerolite --num_procs 2 examples/fault_injection.py --fail-rank 1 --fail-step 2 --mode raise
    zerolite --num_procs 2 examples/fault_injection.py --fail-rank 0 --fail-step 2 --mode kill

The failing rank fails right before its forward pass of step K, while the other ranks enter
that step's all-gather: the launcher must bring every rank down quickly, non-zero exit code,
with the failed or hung rank named. Modes:

    raise         raise an exception
    raise-thread  raise while a non-daemon thread (a dataloader, a logger) keeps running
    kill          SIGKILL itself (no traceback, no cleanup)
    stop          SIGSTOP itself (hung, not dead: its heartbeat stops too)
    deadlock      the main thread blocks forever on a lock (the heartbeat thread lives on)
    skip          skip this step's loss all-reduce, then do local work for an hour (as a rank
                  that ran out of data): the others wait in a collective it never enters
    slow          sleep --slow-s seconds, then go on (healthy: must not be killed)

Collective timeout: ZEROLITE_TIMEOUT seconds (default 300).
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

import zerolite
from zerolite.comm import all_reduce_sum
from zerolite.models import GPT, GPTConfig


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that fails (-1: none)")
    p.add_argument("--fail-step", type=int, default=-1, help="step (1-based) at which it fails")
    p.add_argument("--mode", default="raise", choices=("raise", "raise-thread", "kill", "stop",
                                                       "deadlock", "skip", "slow"),
                   help="how the rank fails (see the module docstring)")
    p.add_argument("--slow-s", type=float, default=10.0, help="sleep of --mode slow")
    p.add_argument("--watchdog-config", default="", metavar="HEARTBEAT,STALL,FACTOR,INTERVAL",
                   help="seconds/factor for the zerolite.watchdog_* config keys")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to train")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    return p.parse_args()


def inject(rank: int, step: int, mode: str, slow_s: float) -> bool:
    """Make the fault happen; True when the rank should skip its loss all-reduce."""
    print(f"[rank {rank}] fault injection: {mode} at step {step}", flush=True)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if mode == "deadlock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    if mode == "skip":
        return True
    if mode == "slow":
        time.sleep(slow_s)
        return False
    if mode == "raise-thread":
        threading.Thread(target=time.sleep, args=(3600,), name="lingering", daemon=False).start()
    raise RuntimeError(f"fault_injection: rank {rank} raised at step {step} (--mode raise)")


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=16))
    device = torch.device("cpu")
    if torch.cuda.is_available():  # the launcher gives each rank one GPU (nccl)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        model = model.to(device)
    timeout = int(float(os.environ.get("ZEROLITE_TIMEOUT", "300")))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3},
        "steps_per_print": 1,
        "zerolite": {"comm_timeout_s": max(timeout, 1)},
    }
    if args.watchdog_config:
        hb, stall, factor, interval = (float(v) for v in args.watchdog_config.split(","))
        config["zerolite"].update(watchdog_heartbeat_timeout_s=hb, watchdog_stall_timeout_s=stall,
                                  watchdog_stall_step_factor=factor, watchdog_interval_s=interval)
    engine, _, _, _ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"[rank {rank}] pid {os.getpid()} started (world size {world})", flush=True)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(1, args.steps + 1):
        skip = False
        if rank == args.fail_rank and step == args.fail_step:
            skip = inject(rank, step, args.mode, args.slow_s)
        data = torch.randint(0, 64, (2, 9), generator=gen).to(device)
        loss = engine(data[:, :-1], data[:, 1:])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        if skip:
            print(f"[rank {rank}] skipped the loss all-reduce of step {step}", flush=True)
            time.sleep(3600)
        all_reduce_sum(mean)
        if rank == 0:
            print(f"step {step} loss {mean.item() / world:.4f}", flush=True)
        time.sleep(args.step_sleep)
    print(f"[rank {rank}] done after {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
