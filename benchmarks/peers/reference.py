"""Single-process reference on the whole global batch (same init, batches, AdamW, fp64-norm
clipping). bf16: CPU autocast, the closest single-process analogue of mixed precision."""
from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch

from benchmarks.peers import workload as W


def run(size_name: str, dtype: str, steps: int) -> list[float]:
    size = W.SIZES[size_name]
    model = W.build_model(size)
    opt = W.adamw(model.parameters())
    losses = []
    for x, y in W.global_batches(size, steps):
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16"
               else contextlib.nullcontext())
        with ctx:
            loss = model(x, y)
        loss.backward()
        W.clip_fp64_([p.grad for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", required=True, choices=list(W.SIZES))
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    losses = run(args.size, args.dtype, args.steps)
    with open(args.out, "w") as f:
        json.dump({"size": args.size, "dtype": args.dtype, "losses": losses}, f)


if __name__ == "__main__":
    main()
