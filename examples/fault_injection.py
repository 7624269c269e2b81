"""Tiny ZeRO-3 training run that can make one rank fail on purpose (fail-fast checks).

    zerolite --num_procs 2 examples/fault_injection.py                       # trains, exits 0
    zerolite --num_procs 2 examples/fault_injection.py --fail-rank 1 --fail-step 2 --mode raise
    zerolite --num_procs 2 examples/fault_injection.py --fail-rank 0 --fail-step 2 --mode kill

The failing rank stops right before its forward pass of step K, while the other ranks enter
that step's all-gather: the launcher must bring every rank down quickly, non-zero exit code,
with the raised error visible. Collective timeout: ZEROLITE_TIMEOUT seconds (default 300).
"""
from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

import zerolite
from zerolite.models import GPT, GPTConfig


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that fails (-1: none)")
    p.add_argument("--fail-step", type=int, default=-1, help="step (1-based) at which it fails")
    p.add_argument("--mode", choices=("raise", "kill"), default="raise",
                   help="raise an exception, or SIGKILL the process (no traceback, no cleanup)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to train")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    return p.parse_args()


def inject(rank: int, step: int, mode: str) -> None:
    print(f"[rank {rank}] fault injection: {mode} at step {step}", flush=True)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
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
    engine, _, _, _ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"[rank {rank}] pid {os.getpid()} started (world size {world})", flush=True)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(1, args.steps + 1):
        if rank == args.fail_rank and step == args.fail_step:
            inject(rank, step, args.mode)
        data = torch.randint(0, 64, (2, 9), generator=gen).to(device)
        loss = engine(data[:, :-1], data[:, 1:])
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_sleep)
    print(f"[rank {rank}] done after {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
