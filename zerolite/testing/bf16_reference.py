"""Single-process "bf16 params + fp32 masters" reference: what zerolite's bf16 mode does,
written in plain torch, for the bf16 tests and the bf16 study.

A bf16 copy of the model runs forward and backward; fp32 masters, taken from the model's
ORIGINAL fp32 values (not from the bf16 copy), are updated by a torch optimizer on fp32
gradients, and the bf16 copy is re-cast (round-to-nearest) from them after every step.
The global batch is split into world x gas equal row blocks, rank-major (piece r*gas + k is
rank r's micro-step k, as reference.rank_micro_batches deals them), each backward of the
loss divided by gas, as engine.backward divides it; the pieces' gradients are combined with
DeepSpeed's arithmetic ([Note: gradient precision] in zerolite/zero/flat_param.py): summed
in the accumulation dtype and reduced in the communication dtype (both default to the
training dtype), each rank's micro-steps first at stages 0-1, each micro-step's reduction
first at stages 2-3. world=gas=1: one backward over the whole global batch.
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


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 `t` rounded to `dtype` (as a 16-bit tensor op stores its fp32 result)."""
    return t.to(dtype).float()


def piece_gradients(work: nn.Module, batch, loss_fn, *, world: int, gas: int):
    """Plain torch over the global batch's world x gas pieces (rank-major: piece r*gas + k is
    rank r's micro-step k): each piece's loss (a float) and its gradient of loss / gas in the
    module's dtype (zeros where a parameter got none), one list per piece in the order of
    the module's distinct parameters."""
    params = list(dict.fromkeys(work.parameters()))
    losses, grads = [], []
    for x, y in split_rows(batch, world * gas):
        loss = loss_fn(work, x, y)
        (loss / gas).backward()  # as engine.backward divides it
        grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                      for p in params])
        work.zero_grad(set_to_none=True)
        losses.append(loss.float().item())
    return losses, grads


def combine_gradients(grads, *, world: int, gas: int, stage: int, comm_dtype: torch.dtype,
                      accum_dtype: torch.dtype) -> torch.Tensor:
    """One parameter's gradient for the step, from `grads[r * gas + k]` (rank r's micro-step
    k, already divided by gas) with DeepSpeed's arithmetic: stages 0-1 add each rank's
    micro-steps in `accum_dtype`, then sum the ranks in `comm_dtype` (stage 0 divides by the
    world after the sum, stages 1-3 before it, as DeepSpeed's engine and ZeRO optimizers do);
    stages 2-3 reduce each micro-step so and add the reduced ones in `accum_dtype`. Ranks
    are summed in rank order (the collective's own order at world 2). Returns fp32."""
    def reduced(parts):
        pre = stage > 0
        total = None
        for part in parts:
            send = _rounded(part, comm_dtype)
            if pre:
                send = _rounded(send / world, comm_dtype)
            total = send if total is None else _rounded(total + send, comm_dtype)
        if not pre:
            total = _rounded(total / world, comm_dtype)
        return _rounded(total, accum_dtype)

    def accumulated(parts):
        total = None
        for part in parts:
            part = _rounded(part, accum_dtype)
            total = part if total is None else _rounded(total + part, accum_dtype)
        return total

    piece = lambda r, k: grads[r * gas + k].float()  # noqa: E731
    if stage <= 1:
        return reduced([accumulated([piece(r, k) for k in range(gas)]) for r in range(world)])
    return accumulated([reduced([piece(r, k) for r in range(world)]) for k in range(gas)])


def train_bf16_master_reference(model: nn.Module, batches, loss_fn, make_optimizer, *,
                                clip: float = 0.0, world: int = 1, gas: int = 1,
                                stage: int = 3, dtype: torch.dtype = torch.bfloat16,
                                comm_dtype: torch.dtype | None = None,
                                accum_dtype: torch.dtype | None = None, make_scheduler=None):
    """loss_fn(module, inputs, targets) -> scalar loss (the module runs in `dtype`).
    `comm_dtype` / `accum_dtype`: DeepSpeed's communication_data_type and
    data_types.grad_accum_dtype (None: `dtype`, their default). `make_scheduler(optimizer)`:
    an LR scheduler stepped after every optimizer step.

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
    sched = make_scheduler(opt) if make_scheduler is not None else None
    arithmetic = dict(world=world, gas=gas, stage=stage, comm_dtype=comm_dtype or dtype,
                      accum_dtype=accum_dtype or dtype)
    losses = []
    for batch in batches:
        piece_losses, per_piece = piece_gradients(work, batch, loss_fn, world=world, gas=gas)
        total = sum(piece_losses)
        for i, m in enumerate(masters):
            m.grad = combine_gradients([g[i] for g in per_piece], **arithmetic)
        if clip > 0:
            clip_grads_([m.grad for m in masters], clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        with torch.no_grad():
            for p, m in zip(work_params, masters):
                p.copy_(m)
        losses.append(total / (world * gas))
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


def train_bf16_masters_reference(model: nn.Module, batches, loss_fn, *, world: int, gas: int,
                                 lr: float, weight_decay: float, clip: float = 0.0,
                                 betas=(0.9, 0.999), eps: float = 1e-8,
                                 rounding: str = "kahan", fp32_moments: bool = False,
                                 reduce_each_micro_step: bool = True):
    """What `bf16.bf16_master_weights_and_grads` trains, in plain torch, one process.

    The masters ARE the bf16 weights (the model's fp32 values cast once). Each micro-step k
    reduces the fp32 gradients of the `world` pieces r*gas + k (rank-major, as
    reference.rank_micro_batches deals them), each times 1/gas, summed in rank order and
    divided by `world`; the result is stored in bf16 and added in bf16 over micro-steps (the
    gradient shard lives in the master's dtype). Then float64-norm clipping of the bf16
    gradients and the AdamW step of triton_kernels (fp32 maths, stored with `rounding`;
    moments in bf16, or fp32 with `fp32_moments`). `reduce_each_micro_step=False` (ZeRO
    stage 1, which reduces once per step): each rank sums its micro-steps in bf16 first
    (DeepSpeed's default grad_accum_dtype), and the one reduced sum is stored in bf16.

    Returns (per-step mean losses, final bf16 weights by parameter name).
    """
    from triton_kernels.adamw_ref import adamw_step_ref

    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p, []).append(name)
    work = copy.deepcopy(model).to(torch.bfloat16)
    params = list(dict.fromkeys(work.parameters()))
    moment = torch.float32 if fp32_moments else torch.bfloat16
    state = [{"m": torch.zeros_like(p, dtype=moment), "v": torch.zeros_like(p, dtype=moment),
              "c": torch.zeros_like(p)} for p in params]
    losses = []
    for step, batch in enumerate(batches, start=1):
        pieces = split_rows(batch, world * gas)
        grads = [None] * len(params)
        total = 0.0
        windows = [[k] for k in range(gas)] if reduce_each_micro_step else [list(range(gas))]
        for micro_steps in windows:
            reduced = [torch.zeros_like(p, dtype=torch.float32) for p in params]
            for r in range(world):
                local = [torch.zeros_like(p, dtype=torch.float32) for p in params]
                for k in micro_steps:
                    loss = loss_fn(work, *pieces[r * gas + k])
                    loss.backward()
                    for acc, p in zip(local, params):
                        if p.grad is not None:  # summed in bf16 (grad_accum_dtype)
                            acc.copy_(acc.add_(p.grad.float(), alpha=1.0 / gas).bfloat16())
                    work.zero_grad(set_to_none=True)
                    total += loss.float().item()
                for red, acc in zip(reduced, local):
                    red.add_(acc)
            for i, red in enumerate(reduced):
                g = red.mul_(1.0 / world).to(torch.bfloat16)
                grads[i] = g if grads[i] is None else grads[i].add_(g)
        if clip > 0:
            clip_grads_(grads, clip)
        with torch.no_grad():
            for p, g, s in zip(params, grads, state):
                adamw_step_ref(p.view(-1), g.view(-1), s["m"].view(-1), s["v"].view(-1),
                               s["c"].view(-1) if rounding == "kahan" else None, step=step,
                               lr=lr, beta1=betas[0], beta2=betas[1], eps=eps,
                               weight_decay=weight_decay, adamw=True, rounding=rounding)
        losses.append(total / (world * gas))
    out = {}
    for orig, p in zip(names, params):
        for name in names[orig]:
            out[name] = p.detach().clone()
    return losses, out
