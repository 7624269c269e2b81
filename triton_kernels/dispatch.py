"""Backend selection for the block quantization kernels.

``quantize`` / ``dequantize`` / ``dequantize_sum`` use the Triton kernels when the
tensor lives on CUDA and triton is importable; otherwise the pure-torch twins
(bit-exact with the kernels).  ``ZEROLITE_FORCE_TRITON=1`` forces the Triton path
even on CPU (use with ``TRITON_INTERPRET=1`` set before triton is imported).
Triton is only imported when the Triton path is actually taken.
"""

from __future__ import annotations

import os

import torch

from . import quantize_ref as _ref

__all__ = ["triton_available", "use_triton", "quantize", "dequantize", "dequantize_sum",
           "quantized_nbytes"]

_TRITON_OK = None


def triton_available() -> bool:
    global _TRITON_OK
    if _TRITON_OK is None:
        try:
            from . import quantize_triton as _qt
            _TRITON_OK = bool(_qt.HAS_TRITON)
        except Exception:
            _TRITON_OK = False
    return _TRITON_OK


def _forced() -> bool:
    return os.environ.get("ZEROLITE_FORCE_TRITON", "0").strip().lower() in ("1", "true", "yes", "on")


def use_triton(t: torch.Tensor) -> bool:
    if _forced():
        if not triton_available():
            raise RuntimeError("ZEROLITE_FORCE_TRITON=1 but triton is not importable")
        return True
    return t.is_cuda and triton_available()


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
