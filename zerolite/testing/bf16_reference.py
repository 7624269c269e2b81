"""Single-process "bf16 params + fp32 masters" reference: what zerolite's bf16 mode does,
written in plain torch, for the bf16 tests and the bf16 study.

A bf16 copy of the model runs forward and backward; fp32 masters, taken from the model's
ORIGINAL fp32 values (not from the bf16 copy), are updated by a torch optimizer on fp32
gradients, and the bf16 copy is re-cast (round-to-nearest) from them after every step.
The global batch is split into `pieces` equal row blocks (what the ranks x micro-steps
of a distributed run see); each piece's bf16 gradients are cast to fp32 and the pieces
are averaged in fp32, as zerolite's fp32 reduction does. pieces=1: one bf16 backward over
the whole global batch.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from zerolite.optim.grad_norm import clip_grads_


def split_rows(batch, pieces: int):
    x, y = batch
    if x.shape[0] % pieces:
        raise ValueError(f"global batch of {x.shape[0]} rows does not split into {pieces} pieces")
    n = x.shape[0] // pieces
    return [(x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]) for i in range(pieces)]


def train_bf16_master_reference(model: nn.Module, batches, loss_fn, make_optimizer, *,
                                clip: float = 0.0, pieces: int = 1,
                                dtype: torch.dtype = torch.bfloat16):
    """loss_fn(module, inputs, targets) -> scalar loss (the module runs in `dtype`).

    Returns (per-step mean losses, final fp32 master state dict by parameter name).
    """
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p, []).append(name)
    params = list(names)  # model order, tied parameters once
    masters = [nn.Parameter(p.detach().float().clone()) for p in params]
    work = copy.deepcopy(model).to(dtype)
    work_params = list(dict.fromkeys(work.parameters()))
    opt = make_optimizer(masters)
    losses = []
    for batch in batches:
        grads = [torch.zeros_like(m) for m in masters]
        total = 0.0
        for x, y in split_rows(batch, pieces):
            loss = loss_fn(work, x, y)
            loss.backward()
            for g, p in zip(grads, work_params):
                if p.grad is not None:
                    g.add_(p.grad.float())
            work.zero_grad(set_to_none=True)
            total += loss.float().item()
        for m, g in zip(masters, grads):
            m.grad = g.mul_(1.0 / pieces)
        if clip > 0:
            clip_grads_([m.grad for m in masters], clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(work_params, masters):
                p.copy_(m)
        losses.append(total / pieces)
    state = {name: m.detach().clone() for p, m in zip(params, masters) for name in names[p]}
    return losses, state


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at |x|: 2^(e-7) for |x| in [2^e, 2^(e+1)) (8 significant
    bits; torch.finfo(torch.bfloat16).eps is 2^-7, the spacing at 1)."""
    if x == 0:
        return torch.finfo(torch.bfloat16).tiny
    return torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(abs(x)))


def bf16_atol(values, roundings: int) -> float:
    """An absolute tolerance from the format: `roundings` bf16 ulps of the largest compared
    value. Kernels of different CPUs (AVX-512-BF16 vs AVX2) round intermediate results
    differently; each rounding on the path to a value may move it by one ulp."""
    return roundings * max(bf16_ulp(float(v)) for v in values)
