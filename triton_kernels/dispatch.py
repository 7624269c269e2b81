"""Backend selection for the Triton kernels (block quantization, top-k selection, Adam step).

``quantize`` / ``dequantize`` / ``dequantize_sum`` use the Triton kernels when the
tensor lives on CUDA and triton is importable; otherwise the pure-torch twins
(bit-exact with the kernels).  ``ZEROLITE_FORCE_TRITON=1`` forces the Triton path
even on CPU (use with ``TRITON_INTERPRET=1`` set before triton is imported).
Triton is only imported when the Triton path is actually taken.

[Note: no silent fallback] When the kernels cannot be used -- triton missing, an installed
triton failing to import, or our kernel module failing to build -- the twins run, and one
warning says why (once per process).
"""

from __future__ import annotations

import os
import warnings

import torch

from . import adamw_ref as _adamw
from . import quantize_ref as _ref
from . import topk_ref as _topk

__all__ = ["triton_available", "use_triton", "quantize", "dequantize", "dequantize_sum",
           "quantized_nbytes", "topk_select", "adamw_step"]

_TRITON_OK = None
_WHY_NOT: str | None = None
_WARNED = False


def triton_available() -> bool:
    """Can the Triton kernels run? (imports triton on first call)."""
    global _TRITON_OK, _WHY_NOT
    if _TRITON_OK is None:
        try:
            from . import quantize_triton as _qt
        except Exception as exc:  # triton imported, but our kernels failed to build
            _TRITON_OK = False
            _WHY_NOT = f"the Triton kernels failed to import ({type(exc).__name__}: {exc})"
        else:
            _TRITON_OK = bool(_qt.HAS_TRITON)
            if _qt.IMPORT_ERROR:
                _WHY_NOT = f"triton is installed but failed to import ({_qt.IMPORT_ERROR})"
            elif not _TRITON_OK:
                _WHY_NOT = "triton is not installed (pip install triton)"
        if _WHY_NOT and _qt_installed():
            _warn_fallback()
    return _TRITON_OK


def _qt_installed() -> bool:
    """Warn at once where triton is installed; a missing triton warns on first CUDA use."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def _warn_fallback() -> None:
    global _WARNED
    if not _WARNED and _WHY_NOT:
        _WARNED = True
        warnings.warn(f"triton_kernels: {_WHY_NOT}; quantization, top-k and the Adam step "
                      "run in the pure-torch twins (same results, slower on CUDA)",
                      RuntimeWarning, stacklevel=3)


def _forced() -> bool:
    return os.environ.get("ZEROLITE_FORCE_TRITON", "0").strip().lower() in ("1", "true", "yes", "on")


def use_triton(t: torch.Tensor) -> bool:
    if _forced():
        if not triton_available():
            raise RuntimeError("ZEROLITE_FORCE_TRITON=1 but triton is not importable")
        return True
    if not t.is_cuda:
        return False
    if triton_available():
        return True
    _warn_fallback()  # CUDA tensors without kernels: say so once
    return False


def quantize(x: torch.Tensor, bits: int, block_size: int, stochastic: bool = False, seed: int = 0):
    """-> (codes, scales); see :mod:`triton_kernels.quantize_ref` for the format."""
    if use_triton(x):
        from .quantize_triton import quantize_triton
        return quantize_triton(x, bits, block_size, stochastic=stochastic, seed=seed)
    return _ref.quantize_ref(x, bits, block_size, stochastic=stochastic, seed=seed)


def dequantize(codes, scales, bits: int, block_size: int, numel: int,
               out_dtype: torch.dtype = torch.float32):
    if use_triton(codes):
        from .quantize_triton import dequantize_triton
        return dequantize_triton(codes, scales, bits, block_size, numel, out_dtype)
    return _ref.dequantize_ref(codes, scales, bits, block_size, numel, out_dtype)


def dequantize_sum(codes_2d, scales_2d, bits: int, block_size: int, numel_per_chunk: int):
    if use_triton(codes_2d):
        from .quantize_triton import dequantize_sum_triton
        return dequantize_sum_triton(codes_2d, scales_2d, bits, block_size, numel_per_chunk)
    return _ref.dequantize_sum_ref(codes_2d, scales_2d, bits, block_size, numel_per_chunk)


def quantized_nbytes(numel: int, bits: int, block_size: int) -> int:
    """Bytes on the wire: codes for the padded length (nblocks*block_size) + fp32 scales."""
    _ref.check_args(bits, block_size)
    nb = _ref.num_blocks(numel, block_size)
    return nb * block_size * bits // 8 + nb * 4


def topk_select(x: torch.Tensor, k: int, residual: torch.Tensor | None = None):
    """Top-k magnitude selection of a 1-D fp32 tensor -> ``(idx int32, vals fp32, residual)``;
    see :mod:`triton_kernels.topk_ref` for the rule. ``residual`` (optional, may be ``x``)
    receives x with the selected entries zeroed."""
    if use_triton(x):
        from .topk_triton import topk_select_triton
        return topk_select_triton(x, k, residual)
    idx, vals, res = _topk.topk_select_ref(x, k)
    if residual is not None:
        residual.reshape(-1).copy_(res)
        res = residual.reshape(-1)
    return idx, vals, res


def adamw_step(param, grad, exp_avg, exp_avg_sq, compensation=None, *, step: int, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, adamw: bool = True,
               rounding: str = "nearest", seed: int = 0) -> None:
    """One fused Adam (``adamw=False``) / AdamW step in place on bf16 or fp32 master weights,
    ``rounding`` "nearest", "kahan" (needs ``compensation``) or "stochastic"; ``step`` counts
    from 1. See :mod:`triton_kernels.adamw_ref` for the numerics (the kernel and the twin agree
    bit for bit)."""
    kw = dict(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
              adamw=adamw, rounding=rounding, seed=seed)
    if use_triton(param):
        from .adamw_triton import adamw_step_triton
        return adamw_step_triton(param, grad, exp_avg, exp_avg_sq, compensation, **kw)
    return _adamw.adamw_step_ref(param, grad, exp_avg, exp_avg_sq, compensation, **kw)
