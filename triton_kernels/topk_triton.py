"""Triton kernel for top-k gradient selection (sparsified gradients with error feedback).

Numerics are defined by (and bit-exact with) :func:`triton_kernels.topk_ref.topk_select_ref`:
same threshold, same indices in ascending order, same values, same residual.

How it finds the threshold without sorting: an exact radix select on the magnitude keys
(the int32 bits of ``|x|``, ordered as ``|x|``), from three histograms:

  level 0  bins = key bits 30..20 (2048 bins) over every element
  level 1  bins = key bits 19..10 (1024 bins) over the elements in the chosen level-0 bin
  level 2  bins = key bits  9..0  (1024 bins) over the elements in the chosen level-1 bin

After each level the bin holding the k-th largest key is picked on the device (a cumulative
count from the top; no host sync), so after three passes the prefix *is* the k-th largest key,
the same value ``torch.topk`` gives. Each program histograms its tile with ``tl.histogram``
and adds it to the global histogram with one vector ``atomic_add`` (integer adds: the result
does not depend on their order).

Then two passes write the selection in index order (deterministic, so the owner's sums do not
depend on scheduling): a count per tile, an exclusive cumsum over tiles (torch), and the
compaction pass, which places each selected element at its tile's offset plus its rank inside
the tile (``tl.cumsum``) and writes the residual (``x`` with the selected entries zeroed; in
place when the caller passes ``x`` as the residual buffer). One host sync in all: the number
of selected entries, needed to size the outputs (and, in the reducer, the all_to_all splits).

Tiles: one fixed tile per program (large in the interpreter, which is slow per program).
"""
from __future__ import annotations

import torch

from .runtime import interpreting

from .optional_triton import HAS_TRITON, IMPORT_ERROR, TRITON_INSTALLED, tl, triton  # noqa: F401

__all__ = ["HAS_TRITON", "IMPORT_ERROR", "topk_select_triton", "topk_threshold_triton"]

_TILE = 8192 if interpreting() else 2048
_WARPS = 8
# (bin shift, bins, prefix shift) per radix level; keys are < 2**31 (sign bit cleared).
_LEVELS = ((20, 2048, 31), (10, 1024, 20), (0, 1024, 10))

if HAS_TRITON:

    @triton.jit
    def _keys(x_ptr, offs, n):
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        key = tl.abs(x).to(tl.int32, bitcast=True)
        return x, key, m

    @triton.jit
    def _hist_kernel(x_ptr, hist_ptr, prefix_ptr, n, SHIFT: tl.constexpr, NB: tl.constexpr,
                     PSHIFT: tl.constexpr, TILE: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * TILE + tl.arange(0, TILE)
        _, key, m = _keys(x_ptr, offs, n)
        prefix = tl.load(prefix_ptr)
        sel = m & ((key >> PSHIFT) == prefix)
        h = tl.histogram((key >> SHIFT) & (NB - 1), NB, mask=sel)
        tl.atomic_add(hist_ptr + tl.arange(0, NB), h)

    @triton.jit
    def _count_kernel(x_ptr, thr_ptr, counts_ptr, n, TILE: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * TILE + tl.arange(0, TILE)
        _, key, m = _keys(x_ptr, offs, n)
        thr = tl.load(thr_ptr)
        sel = m & (key >= thr) & (key > 0)
        tl.store(counts_ptr + pid, tl.sum(sel.to(tl.int32), axis=0))

    @triton.jit
    def _compact_kernel(x_ptr, thr_ptr, start_ptr, idx_ptr, vals_ptr, res_ptr, n,
                        TILE: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * TILE + tl.arange(0, TILE)
        x, key, m = _keys(x_ptr, offs, n)
        thr = tl.load(thr_ptr)
        sel = m & (key >= thr) & (key > 0)
        pos = tl.load(start_ptr + pid) + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(idx_ptr + pos, offs, mask=sel)
        tl.store(vals_ptr + pos, x, mask=sel)
        tl.store(res_ptr + offs, tl.where(sel, 0.0, x), mask=m)


def _require_triton():
    if not HAS_TRITON:
        why = f" (installed, but importing it failed: {IMPORT_ERROR})" if IMPORT_ERROR else ""
        raise RuntimeError(f"triton is not available{why}; use triton_kernels.topk_ref")


def _opts() -> dict:
    return {} if interpreting() else {"num_warps": _WARPS}


def _check(x: torch.Tensor) -> torch.Tensor:
    _require_triton()
    if x.dtype != torch.float32:
        raise TypeError(f"top-k selection works on fp32, got {x.dtype}")
    x = x.reshape(-1)
    if not x.is_contiguous():
        raise ValueError("top-k selection needs a contiguous tensor")
    if x.numel() >= 2 ** 31 - _TILE:
        raise ValueError("tensor too large for int32 indexing")
    return x


def _threshold_key(x: torch.Tensor, k: int) -> torch.Tensor:
    """Device int32 [1]: the k-th largest magnitude key of x (1 <= k <= numel)."""
    n = x.numel()
    grid = (triton.cdiv(n, _TILE),)
    prefix = torch.zeros(1, dtype=torch.int32, device=x.device)
    krem = torch.full((1,), k, dtype=torch.int64, device=x.device)
    for shift, nb, pshift in _LEVELS:
        hist = torch.zeros(nb, dtype=torch.int32, device=x.device)
        _hist_kernel[grid](x, hist, prefix, n, SHIFT=shift, NB=nb, PSHIFT=pshift, TILE=_TILE,
                           **_opts())
        h = hist.to(torch.int64)
        at_or_above = h.flip(0).cumsum(0).flip(0)        # elements in bins >= b
        b = (at_or_above >= krem).sum(0, keepdim=True) - 1  # highest bin reaching k
        krem = krem - (at_or_above.gather(0, b) - h.gather(0, b))
        bits = nb.bit_length() - 1
        prefix = ((prefix.to(torch.int64) << bits) | b).to(torch.int32)
    return prefix


def topk_threshold_triton(x: torch.Tensor, k: int) -> int:
    """The k-th largest magnitude key (as :func:`topk_ref.topk_threshold_ref`)."""
    x = _check(x)
    if not 1 <= k <= x.numel():
        raise ValueError(f"k must be in [1, {x.numel()}], got {k}")
    return int(_threshold_key(x, k).item())


def topk_select_triton(x: torch.Tensor, k: int, residual: torch.Tensor | None = None):
    """Triton twin of :func:`topk_ref.topk_select_ref` -> ``(idx, vals, residual)``.

    ``residual`` (fp32, numel of x) receives x with the selected entries zeroed; it may be x
    itself (in place). Default: a new tensor.
    """
    x = _check(x)
    n = x.numel()
    res = torch.empty_like(x) if residual is None else residual.reshape(-1)
    if res.numel() != n or res.dtype != torch.float32 or not res.is_contiguous():
        raise ValueError("residual must be a contiguous fp32 tensor of x's numel")
    k = min(int(k), n)
    if k <= 0:
        if res.data_ptr() != x.data_ptr():
            res.copy_(x)
        return (torch.empty(0, dtype=torch.int32, device=x.device), x.new_empty(0), res)
    thr = _threshold_key(x, k)
    tiles = triton.cdiv(n, _TILE)
    counts = torch.empty(tiles, dtype=torch.int32, device=x.device)
    _count_kernel[(tiles,)](x, thr, counts, n, TILE=_TILE, **_opts())
    ends = counts.cumsum(0, dtype=torch.int32)
    starts = (ends - counts).contiguous()
    total = int(ends[-1].item())  # the one host sync
    idx = torch.empty(total, dtype=torch.int32, device=x.device)
    vals = torch.empty(total, dtype=torch.float32, device=x.device)
    _compact_kernel[(tiles,)](x, thr, starts, idx, vals, res, n, TILE=_TILE, **_opts())
    return idx, vals, res
