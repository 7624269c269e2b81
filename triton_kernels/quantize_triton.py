"""Triton kernels for block-wise int8 / int4 quantization (ZeRO++ qgZ style).

Numerics are defined by (and bit-exact with) the torch twins in
:mod:`triton_kernels.quantize_ref` -- see its docstring for the format, the
ragged-tail / all-zero / non-finite rules and the error bound.

Importing this module does not require triton (``HAS_TRITON`` tells whether it
is available; ``IMPORT_ERROR`` says why an *installed* triton failed to import); the
kernels are only defined when it is.  For CPU testing call
:func:`triton_kernels.runtime.use_interpreter_if_no_cuda` before triton is imported.

Tiles: compiled, each kernel autotunes a few (tile, num_warps) configs once per format
(block size, bits); interpreted, one large tile (the interpreter is slow per program).

Bit-exactness notes (GPU): divisions use ``tl.math.div_rn`` (IEEE), rounding
half-to-even uses the ``(y + 1.5*2**23) - 1.5*2**23`` trick on the clamped
value, and launches pass ``enable_fp_fusion=False`` so ``acc + q*s`` is never
contracted into an FMA.
"""

from __future__ import annotations

import torch

from .quantize_ref import check_args, num_blocks, seed_key
from .runtime import interpreting

from .optional_triton import HAS_TRITON, IMPORT_ERROR, TRITON_INSTALLED, tl, triton  # noqa: F401

__all__ = ["HAS_TRITON", "IMPORT_ERROR", "TUNED", "quantize_triton", "dequantize_triton",
           "dequantize_sum_triton"]

TUNED = HAS_TRITON and not interpreting()
"""Compiled kernels autotune their tiles; interpreted ones use the fixed tiles below."""
# Elements per program in the interpreter (large tiles: it is slow per program).
_QUANT_TILE = 4096
_DEQ_TILE = 4096


def _prune_quant(configs, named_args, **kwargs):
    """Keep configs whose program covers 512..8192 elements (at least one config)."""
    block = kwargs.get("BLOCK", named_args.get("BLOCK"))
    fit = [c for c in configs if 512 <= c.kwargs["G"] * block <= 8192]
    return fit or [min(configs, key=lambda c: c.kwargs["G"])]


def _autotuned(configs, key, prune=None):
    def wrap(kernel):
        if not TUNED:
            return kernel
        return triton.autotune(configs=configs, key=key,
                               prune_configs_by={"early_config_prune": prune} if prune else None
                               )(kernel)
    return wrap


def _quant_configs():
    return [triton.Config({"G": g}, num_warps=w) for g in (1, 2, 4, 8, 16, 32) for w in (4, 8)]


def _tile_configs():
    return [triton.Config({"TILE": t}, num_warps=w) for t in (1024, 2048, 4096, 8192)
            for w in (4, 8)]


def _launch_opts():
    # enable_fp_fusion is a compile option on GPU; the interpreter ignores it.
    return {"enable_fp_fusion": False}


if HAS_TRITON:

    @triton.jit
    def _lowbias32(x):
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        x = x ^ (x >> 16)
        return x

    @triton.jit
    def _quant_vals(x, scale, idx, key, QMAX: tl.constexpr, STOCH: tl.constexpr):
        """x: fp32 [G, C]; scale: fp32 [G, 1]; idx: element indices [G, C] -> fp32 codes."""
        valid = scale > 0.0  # False for 0 and NaN
        denom = tl.where(valid, scale, 1.0)
        y = tl.math.div_rn(x, denom)
        y = tl.where(valid, y, 0.0)
        if STOCH:
            h = _lowbias32(idx.to(tl.uint32))
            h = _lowbias32((h ^ key).to(tl.uint32))  # key may be i32/i64/constexpr
            u = (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2**-24
            q = tl.floor(y + u)
            q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
        else:
            q = tl.minimum(tl.maximum(y, -QMAX), QMAX)
            q = (q + 12582912.0) - 12582912.0  # round half to even, |q| <= 2**22
        return q

    @triton.jit
    def _block_stats(x):
        """x fp32 [G, C] -> (absmax over finite values [G], any-non-finite [G] int32)."""
        ax = tl.abs(x)
        ok = ax <= 3.4028234663852886e38  # False for NaN and +-Inf
        bad = tl.max(tl.where(ok, 0, 1), axis=1)
        amax = tl.max(tl.where(ok, ax, 0.0), axis=1)
        return amax, bad

    @_autotuned(_quant_configs(), key=["BLOCK", "BITS", "STOCH"], prune=_prune_quant)
    @triton.jit
    def _quant_kernel(x_ptr, codes_ptr, scales_ptr, n, nblocks, key,
                      BLOCK: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr,
                      QMAX: tl.constexpr, STOCH: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * G + tl.arange(0, G)
        row_ok = rows < nblocks
        if BITS == 8:
            cols = tl.arange(0, BLOCK)
            idx = rows[:, None] * BLOCK + cols[None, :]
            x = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
            amax, bad = _block_stats(x)
            scale = tl.math.div_rn(amax, QMAX * 1.0)
            scale = tl.where(bad > 0, float("nan"), scale)
            q = _quant_vals(x, scale[:, None], idx, key, QMAX, STOCH)
            tl.store(codes_ptr + idx, q.to(tl.int8), mask=row_ok[:, None])
        else:
            HALF: tl.constexpr = BLOCK // 2
            cols = tl.arange(0, HALF)
            ie = rows[:, None] * BLOCK + 2 * cols[None, :]
            io = ie + 1
            xe = tl.load(x_ptr + ie, mask=ie < n, other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + io, mask=io < n, other=0.0).to(tl.float32)
            ame, bade = _block_stats(xe)
            amo, bado = _block_stats(xo)
            amax = tl.maximum(ame, amo)
            scale = tl.math.div_rn(amax, QMAX * 1.0)
            scale = tl.where((bade + bado) > 0, float("nan"), scale)
            qe = _quant_vals(xe, scale[:, None], ie, key, QMAX, STOCH).to(tl.int32)
            qo = _quant_vals(xo, scale[:, None], io, key, QMAX, STOCH).to(tl.int32)
            packed = (qe & 0xF) | ((qo & 0xF) << 4)
            bidx = rows[:, None] * HALF + cols[None, :]
            tl.store(codes_ptr + bidx, packed.to(tl.uint8), mask=row_ok[:, None])
        tl.store(scales_ptr + rows, scale, mask=row_ok)

    @triton.jit
    def _load_codes_f32(codes_ptr, offs, mask, BITS: tl.constexpr):
        if BITS == 8:
            q = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
        else:
            b = tl.load(codes_ptr + offs // 2, mask=mask, other=0).to(tl.int32)
            nib = tl.where((offs & 1) == 1, b >> 4, b) & 0xF
            q = ((nib ^ 8) - 8).to(tl.float32)
        return q

    @_autotuned(_tile_configs(), key=["BLOCK", "BITS"])
    @triton.jit
    def _dequant_kernel(codes_ptr, scales_ptr, out_ptr, n,
                        BLOCK: tl.constexpr, TILE: tl.constexpr, BITS: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * TILE + tl.arange(0, TILE)
        mask = offs < n
        q = _load_codes_f32(codes_ptr, offs, mask, BITS)
        s = tl.load(scales_ptr + offs // BLOCK, mask=mask, other=0.0)
        y = q * s
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    @_autotuned(_tile_configs(), key=["BLOCK", "BITS"])
    @triton.jit
    def _dequant_sum_kernel(codes_ptr, scales_ptr, out_ptr, n,
                            codes_stride, scales_stride, K: tl.constexpr,
                            BLOCK: tl.constexpr, TILE: tl.constexpr, BITS: tl.constexpr):
        # K (chunks = ranks) is a constexpr: a handful of values per job, and triton 3.6's
        # interpreter cannot loop over a runtime scalar ("only 0-dimensional arrays ...").
        pid = tl.program_id(0)
        offs = pid * TILE + tl.arange(0, TILE)
        mask = offs < n
        acc = tl.zeros([TILE], dtype=tl.float32)
        for k in range(K):
            q = _load_codes_f32(codes_ptr + k * codes_stride, offs, mask, BITS)
            s = tl.load(scales_ptr + k * scales_stride + offs // BLOCK, mask=mask, other=0.0)
            acc = acc + q * s
        tl.store(out_ptr + offs, acc, mask=mask)


def _tile_meta() -> dict:
    return {} if TUNED else {"TILE": _DEQ_TILE}


def _require_triton():
    if not HAS_TRITON:
        why = f" (installed, but importing it failed: {IMPORT_ERROR})" if IMPORT_ERROR else ""
        raise RuntimeError(f"triton is not available{why}; use triton_kernels.quantize_ref twins")


def quantize_triton(x: torch.Tensor, bits: int, block_size: int, stochastic: bool = False,
                    seed: int = 0):
    """Triton twin of :func:`quantize_ref.quantize_ref` -> ``(codes, scales)``."""
    _require_triton()
    qmax = check_args(bits, block_size)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"unsupported input dtype {x.dtype}")
    xf = x.reshape(-1).contiguous()
    n = xf.numel()
    if n >= 2 ** 31 - 2 * block_size:
        raise ValueError("tensor too large for int32 indexing")
    nb = num_blocks(n, block_size)
    padded = nb * block_size
    if bits == 8:
        codes = torch.empty(padded, dtype=torch.int8, device=xf.device)
    else:
        codes = torch.empty(padded // 2, dtype=torch.uint8, device=xf.device)
    scales = torch.empty(nb, dtype=torch.float32, device=xf.device)
    if nb == 0:
        return codes, scales
    meta = {} if TUNED else {"G": max(1, _QUANT_TILE // block_size)}
    grid = lambda m: (triton.cdiv(nb, m["G"]),)  # noqa: E731
    _quant_kernel[grid](xf, codes, scales, n, nb, seed_key(seed) if stochastic else 0,
                        BLOCK=block_size, BITS=bits, QMAX=qmax, STOCH=bool(stochastic),
                        **meta, **_launch_opts())
    return codes, scales


def dequantize_triton(codes: torch.Tensor, scales: torch.Tensor, bits: int, block_size: int,
                      numel: int, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Triton twin of :func:`quantize_ref.dequantize_ref`."""
    _require_triton()
    check_args(bits, block_size)
    codes = codes.reshape(-1).contiguous()
    scales = scales.reshape(-1).to(torch.float32).contiguous()
    per = 1 if bits == 8 else 2
    if codes.numel() * per < numel or scales.numel() * block_size < numel:
        raise ValueError("codes/scales too short for numel")
    out = torch.empty(numel, dtype=out_dtype, device=codes.device)
    if numel == 0:
        return out
    grid = lambda m: (triton.cdiv(numel, m["TILE"]),)  # noqa: E731
    _dequant_kernel[grid](codes, scales, out, numel, BLOCK=block_size, BITS=bits,
                          **_tile_meta(), **_launch_opts())
    return out


def dequantize_sum_triton(codes_2d: torch.Tensor, scales_2d: torch.Tensor, bits: int,
                          block_size: int, numel_per_chunk: int) -> torch.Tensor:
    """Triton twin of :func:`quantize_ref.dequantize_sum_ref` (fp32, k summed in order)."""
    _require_triton()
    check_args(bits, block_size)
    if codes_2d.dim() != 2 or scales_2d.dim() != 2 or codes_2d.shape[0] != scales_2d.shape[0]:
        raise ValueError("expected codes [K, m(/2)] and scales [K, nblocks]")
    K = codes_2d.shape[0]
    per = 1 if bits == 8 else 2
    if codes_2d.shape[1] * per < numel_per_chunk or scales_2d.shape[1] * block_size < numel_per_chunk:
        raise ValueError("codes/scales too short for numel_per_chunk")
    codes_2d = codes_2d.contiguous()
    scales_2d = scales_2d.to(torch.float32).contiguous()
    out = torch.zeros(numel_per_chunk, dtype=torch.float32, device=codes_2d.device)
    if numel_per_chunk == 0 or K == 0:
        return out
    grid = lambda m: (triton.cdiv(numel_per_chunk, m["TILE"]),)  # noqa: E731
    _dequant_sum_kernel[grid](codes_2d, scales_2d, out, numel_per_chunk,
                              codes_2d.stride(0), scales_2d.stride(0), K=K,
                              BLOCK=block_size, BITS=bits, **_tile_meta(), **_launch_opts())
    return out
