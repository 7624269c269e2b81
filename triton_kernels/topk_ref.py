"""Top-k gradient sparsification: the pure-torch reference twin of the selection kernel.

The Triton kernel in ``topk_triton`` must reproduce this bit-exactly (same indices in the same
order, same values, same residual).

Selection
---------
* Input: ``acc``, a 1-D fp32 tensor (the gradient plus the error-feedback residual).
* Order: by magnitude, compared as the IEEE bit pattern of ``|acc|`` read as int32 (``key``).
  For finite values this is the order of ``|acc|``; +-Inf ranks above every finite value and
  NaN above Inf, so a non-finite gradient is always among the entries sent (an fp16 overflow
  still reaches the owner's shard and its overflow check).
* ``k = min(k, numel)``; the threshold ``t`` is the k-th largest key (``torch.topk`` on the
  keys). Every element with ``key >= t`` **and** ``key > 0`` is selected: ties at the threshold
  are all taken (the count can exceed k only by the number of exact ties), zeros never are.
  ``k == 0`` selects nothing.
* Output: ``idx`` (int32, ascending), ``vals = acc[idx]`` (fp32) and the residual
  ``acc`` with the selected entries set to 0 (what error feedback carries to the next step).
"""
from __future__ import annotations

import torch

__all__ = ["magnitude_keys", "topk_threshold_ref", "topk_select_ref", "selected_count"]


def selected_count(numel: int, ratio: float) -> int:
    """k for a unit of ``numel`` elements: ceil(ratio * numel), at least 1, at most numel."""
    if numel <= 0:
        return 0
    return max(1, min(numel, int(-(-ratio * numel // 1))))


def magnitude_keys(acc: torch.Tensor) -> torch.Tensor:
    """int32 keys whose order is the order of |acc| (non-negative IEEE bits)."""
    if acc.dtype != torch.float32:
        raise TypeError(f"top-k selection works on fp32, got {acc.dtype}")
    return acc.reshape(-1).abs().view(torch.int32)


def topk_threshold_ref(acc: torch.Tensor, k: int) -> int:
    """The k-th largest magnitude key (k >= 1)."""
    keys = magnitude_keys(acc)
    return int(torch.topk(keys, k, sorted=False).values.min())


def topk_select_ref(acc: torch.Tensor, k: int):
    """-> ``(idx int32 [m], vals fp32 [m], residual fp32 [n])``; see the module docstring."""
    flat = acc.reshape(-1)
    keys = magnitude_keys(flat)
    k = min(int(k), flat.numel())
    if k <= 0:
        return (torch.empty(0, dtype=torch.int32, device=flat.device),
                flat.new_empty(0), flat.clone())
    thr = torch.topk(keys, k, sorted=False).values.min()
    mask = (keys >= thr) & (keys > 0)
    idx = mask.nonzero().squeeze(1)
    vals = flat[idx]
    residual = torch.where(mask, torch.zeros_like(flat), flat)
    return idx.to(torch.int32), vals, residual
