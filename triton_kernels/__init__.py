"""zerolite Triton kernels: block-wise int8/int4 quantization (ZeRO++ qgZ style), top-k
gradient selection (sparsified gradients) and the fused Adam/AdamW step on bf16 master weights.

Importing this package never imports triton; the Triton kernels live in
``triton_kernels.quantize_triton``, ``triton_kernels.topk_triton`` and
``triton_kernels.adamw_triton`` and are loaded only when used.
"""

from .adamw_ref import adamw_step_ref
from .dispatch import (adamw_step, dequantize, dequantize_sum, quantize, quantized_nbytes,
                       topk_select, triton_available)
from .quantize_ref import dequantize_ref, dequantize_sum_ref, quantize_ref
from .topk_ref import topk_select_ref

__all__ = [
    "quantize", "dequantize", "dequantize_sum", "quantized_nbytes", "triton_available",
    "quantize_ref", "dequantize_ref", "dequantize_sum_ref", "topk_select", "topk_select_ref",
    "adamw_step", "adamw_step_ref",
]
