"""`deepspeed.utils.tensor_fragment`: DeepSpeed's documented way to read or change one
parameter's fp32 master, gradient and optimizer state under ZeRO (zerolite/fragments.py does
the work; see there for where the values live).

As in DeepSpeed 0.19: every value is fp32 on the engine's device; parameters that are frozen
or not in the optimizer read as None and ignore writes; gradients are readable after a
backward and until the step (summed over the window's micro-steps, averaged over ranks, still
loss-scaled with fp16), and raise DeepSpeed's ValueError otherwise; the `local` calls are
stage 3 only (AssertionError elsewhere) and use DeepSpeed's per-parameter partition: rank r's
`ceil(numel / world)` elements of the flattened parameter, zero padded.

Differences, on purpose: every call here is a collective (all ranks call it, in the same
order), the local ones included; DeepSpeed's stage 3 returns zeros or the last window's
gradients outside the window where zerolite raises (as DeepSpeed's stages 1-2 do); a full
fp32 write reaches the model's own copy at once (DeepSpeed's low-precision copy follows at the
next step); reads return new tensors, never views into the engine's state.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from zerolite.fragments import ZERO3_ONLY, fragments_of


def _local(param):
    frags = fragments_of(param)
    if frags is None:
        raise AssertionError(f"{ZERO3_ONLY} (this parameter is not managed by a zerolite engine)")
    return frags


# -- whole tensors, stages 0-3 --------------------------------------------------------------
def safe_get_full_fp32_param(param):
    """The fp32 master of `param`, whole (None: not managed, frozen or not optimized)."""
    frags = fragments_of(param)
    return None if frags is None else frags.full_param(param)


def safe_set_full_fp32_param(param, value):
    """Replace the fp32 master of `param` (every rank passes the same whole `value`)."""
    frags = fragments_of(param)
    if frags is not None:
        frags.set_full_param(param, value)


def safe_get_full_optimizer_state(param, optim_state_key):
    """The optimizer's per-element state `optim_state_key` (e.g. "exp_avg") of `param`."""
    frags = fragments_of(param)
    return None if frags is None else frags.full_state(param, optim_state_key)


def safe_set_full_optimizer_state(param, value, optim_state_key):
    frags = fragments_of(param)
    if frags is not None:
        frags.set_full_state(param, value, optim_state_key)


def safe_get_full_grad(param):
    """The averaged fp32 gradient of `param` (an unmanaged parameter: its `.grad`)."""
    frags = fragments_of(param)
    return param.grad if frags is None else frags.full_grad(param)


def safe_set_full_grad(param, value):
    frags = fragments_of(param)
    if frags is not None:
        frags.set_full_grad(param, value)
    elif param.grad is not None:
        param.grad.copy_(value)


def safe_update_full_grad_vectorized(param_list: list[torch.nn.Parameter], update_func: Callable):
    """`grad = update_func(grad, param)` for each parameter that requires grad."""
    for p in param_list:
        frags = fragments_of(p)
        if frags is None:
            if p.grad is not None:
                p.grad.copy_(update_func(p.grad, p))
        elif p.requires_grad and frags.optimized(p):
            frags.set_full_grad(p, update_func(frags.full_grad(p), p))


# -- this rank's partition, stage 3 ---------------------------------------------------------
def safe_get_local_fp32_param(param):
    return _local(param).local_param(param)


def safe_get_local_grad(param):
    return _local(param).local_grad(param)


def safe_get_local_optimizer_state(param, optim_state_key):
    return _local(param).local_param(param, optim_state_key)


def safe_set_local_fp32_param(param, value):
    _local(param).set_local_param(param, value)


def safe_set_local_grad(param, value):
    _local(param).set_local_grad(param, value)


def safe_set_local_optimizer_state(param, value, optim_state_key):
    _local(param).set_local_param(param, value, optim_state_key)


__all__ = ["safe_get_full_fp32_param", "safe_set_full_fp32_param",
           "safe_get_full_optimizer_state", "safe_set_full_optimizer_state",
           "safe_get_full_grad", "safe_set_full_grad", "safe_update_full_grad_vectorized",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state"]
