"""Single-process PyTorch references that multi-rank runs are compared against."""
from __future__ import annotations

import torch
import torch.distributed as dist

from zerolite.optim.grad_norm import clip_grads_


def make_token_batches(steps: int, global_batch: int, seq_len: int, vocab: int = 256,
                       seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic (inputs, targets) global batches a small model can learn quickly:
    each row counts from a random start in a random stride (1-4), modulo `vocab`."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (global_batch, 1), generator=g)
        stride = torch.randint(1, 5, (global_batch, 1), generator=g)
        data = (start + stride * torch.arange(seq_len + 1)) % vocab
        out.append((data[:, :-1].contiguous(), data[:, 1:].contiguous()))
    return out


def rank_micro_batches(batch, rank: int, world_size: int, gas: int):
    """This rank's `gas` micro-batches of one global batch (rank-major, like a sampler)."""
    x, y = batch
    per_rank = x.shape[0] // world_size
    micro = per_rank // gas
    lo = rank * per_rank
    return [(x[lo + i * micro: lo + (i + 1) * micro], y[lo + i * micro: lo + (i + 1) * micro])
            for i in range(gas)]


def train_reference(model, batches, make_optimizer, clip: float = 0.0, make_scheduler=None,
                    scheduler_steps: int = 1, params=None):
    """Plain PyTorch on the whole global batch; float64-norm clipping like the engine.

    `params` (default: model.parameters()) is what `make_optimizer` gets, e.g. param-group
    dicts; `make_scheduler(optimizer)` builds an LR scheduler stepped `scheduler_steps` times
    after each optimizer step (Accelerate steps one num_processes times).
    Returns (per-step losses, final fp32 state dict).
    """
    opt = make_optimizer(model.parameters() if params is None else params)
    sched = make_scheduler(opt) if make_scheduler is not None else None
    device = next(model.parameters()).device
    losses = []
    for x, y in batches:
        loss = model(x.to(device), y.to(device))
        loss.backward()
        if clip > 0:
            clip_grads_([p.grad for p in model.parameters()], clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for _ in range(scheduler_steps if sched is not None else 0):
            sched.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_engine(engine, batches, rank: int, world_size: int, torch_backward: bool = False):
    """Run the engine over the same global batches (moved to `engine.device`, as a user's
    script does); returns the per-step mean losses. `torch_backward`: `loss.backward()`
    instead of `engine.backward(loss)` (DeepSpeed >= 0.18 programs)."""
    gas = engine.gradient_accumulation_steps()
    device = getattr(engine, "device", torch.device("cpu"))
    losses = []
    for batch in batches:
        total = torch.zeros((), dtype=torch.float64, device=device)
        for x, y in rank_micro_batches(batch, rank, world_size, gas):
            loss = engine(x.to(device), y.to(device))
            if torch_backward:
                loss.backward()
            else:
                engine.backward(loss)
            engine.step()
            total += loss.item()
        if world_size > 1:
            dist.all_reduce(total)
        losses.append(total.item() / (world_size * gas))
    return losses
