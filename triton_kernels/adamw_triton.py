"""Triton kernel for the fused Adam / AdamW step on bf16 (or fp32) master weights.

Numerics are defined by (and bit-exact with) :func:`triton_kernels.adamw_ref.adamw_step_ref`:
see its module docstring for the formula, the three roundings of the parameter ("nearest",
"kahan", "stochastic") and the hash. One elementwise kernel, one program per tile; the rounding
mode, the weight-decay form and the storage dtypes are constexpr flags.

Bit-exactness notes (GPU):

* every operation is one IEEE round-to-nearest operation: ``tl.math.sqrt_rn`` and
  ``tl.math.div_rn`` (Triton's ``/`` and ``sqrt`` may be approximate on NVIDIA), the three
  fused multiply-adds of the formula are explicit ``tl.fma``, and launches pass
  ``enable_fp_fusion=False`` so no other multiply-add is contracted;
* bf16 values move as their int16 bit patterns: loads widen them exactly (``bits << 16``),
  stores round to nearest even with integer arithmetic, so neither depends on the backend's
  fp32 -> bf16 conversion (Triton's interpreter truncates it);
* the scalars are computed and rounded to fp32 on the host (``adamw_ref.scalars``) and made
  fp32 tensors in the kernel (the interpreter would type a Python float outside fp32's normal
  range as fp64);
* not controlled: the GPU's handling of subnormals in ``tl.fma``/``div_rn``/``sqrt_rn`` (PTX
  ``.rn`` without ``.ftz``, so IEEE, as far as we know; not yet run on a GPU).

Tiles: one fixed tile per program (large in the interpreter, which is slow per program).
"""
from __future__ import annotations

import torch

from .adamw_ref import check_args, hash_key, scalars
from .runtime import interpreting

from .optional_triton import HAS_TRITON, IMPORT_ERROR, TRITON_INSTALLED, tl, triton  # noqa: F401

__all__ = ["HAS_TRITON", "IMPORT_ERROR", "adamw_step_triton"]

_TILE = 8192 if interpreting() else 1024
_WARPS = 4
_ROUND = {"nearest": 0, "kahan": 1, "stochastic": 2}

if HAS_TRITON:

    @triton.jit
    def _load_f32(ptr, offs, mask, BF16: tl.constexpr):
        if BF16:  # int16 bit patterns: widen exactly
            bits = tl.load(ptr + offs, mask=mask, other=0)
            x = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return x

    @triton.jit
    def _rne_bf16(x):
        """fp32 -> bf16 bit pattern (int16), round to nearest even; NaN -> 0x7FC0."""
        u = x.to(tl.int32, bitcast=True)
        r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        r = tl.where(x != x, 0x7FC0, r)
        return r.to(tl.int16)

    @triton.jit
    def _store(ptr, offs, mask, x, BF16: tl.constexpr):
        if BF16:
            tl.store(ptr + offs, _rne_bf16(x), mask=mask)
        else:
            tl.store(ptr + offs, x, mask=mask)

    @triton.jit
    def _hash16(idx, key):
        """fmix32((idx * 0x9E3779B1 + key) mod 2**32) >> 16 -> int32 in [0, 65536)."""
        x = (idx.to(tl.uint32) * 0x9E3779B1 + key).to(tl.uint32)
        x = x ^ (x >> 16)
        x = x * 0x85EBCA6B
        x = x ^ (x >> 13)
        x = x * 0xC2B2AE35
        x = x ^ (x >> 16)
        return (x >> 16).to(tl.int32)

    @triton.jit
    def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, c_ptr, n,
                      decay_, wd_, w1_, w1m1_, b2_, w2_, bc2s_, eps_, nss_, key,
                      P_BF16: tl.constexpr, G_BF16: tl.constexpr, M_BF16: tl.constexpr,
                      V_BF16: tl.constexpr, WD_MODE: tl.constexpr, LERP_SMALL: tl.constexpr,
                      ROUND: tl.constexpr, TILE: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * TILE + tl.arange(0, TILE)
        mask = offs < n
        decay = tl.full([1], decay_, tl.float32)
        wd = tl.full([1], wd_, tl.float32)
        w1 = tl.full([1], w1_, tl.float32)
        w1m1 = tl.full([1], w1m1_, tl.float32)
        b2 = tl.full([1], b2_, tl.float32)
        w2 = tl.full([1], w2_, tl.float32)
        bc2s = tl.full([1], bc2s_, tl.float32)
        eps = tl.full([1], eps_, tl.float32)
        nss = tl.full([1], nss_, tl.float32)

        p = _load_f32(p_ptr, offs, mask, P_BF16)
        if ROUND == 1:
            p = p + _load_f32(c_ptr, offs, mask, True)
        g = _load_f32(g_ptr, offs, mask, G_BF16)
        if WD_MODE == 2:  # Adam: L2 penalty in the gradient
            g = tl.fma(p, wd, g)
        if WD_MODE == 1:  # AdamW: decoupled decay
            p = p * decay
        m = _load_f32(m_ptr, offs, mask, M_BF16)
        v = _load_f32(v_ptr, offs, mask, V_BF16)
        d = g - m
        if LERP_SMALL:  # torch's lerp: start + w * (end - start) for w < 0.5
            m = tl.fma(d, w1, m)
        else:  # end - (end - start) * (1 - w)
            m = tl.fma(d, w1m1, g)
        v = tl.fma(g * w2, g, v * b2)
        denom = tl.math.div_rn(tl.math.sqrt_rn(v), bc2s) + eps
        p = p + tl.math.div_rn(m * nss, denom)
        _store(m_ptr, offs, mask, m, M_BF16)
        _store(v_ptr, offs, mask, v, V_BF16)
        if P_BF16:
            if ROUND == 2:  # stochastic: add r to the fp32 bits, keep the high 16
                u = p.to(tl.int32, bitcast=True)
                sr = (u + _hash16(offs, key)) >> 16
                sr = tl.where(p != p, 0x7FC0, sr)
                tl.store(p_ptr + offs, sr.to(tl.int16), mask=mask)
            else:
                nb = _rne_bf16(p)
                tl.store(p_ptr + offs, nb, mask=mask)
                if ROUND == 1:  # kahan: what the bf16 store lost
                    lost = p - (nb.to(tl.int32) << 16).to(tl.float32, bitcast=True)
                    tl.store(c_ptr + offs, _rne_bf16(lost), mask=mask)
        else:
            tl.store(p_ptr + offs, p, mask=mask)


def _require_triton():
    if not HAS_TRITON:
        why = f" (installed, but importing it failed: {IMPORT_ERROR})" if IMPORT_ERROR else ""
        raise RuntimeError(f"triton is not available{why}; use triton_kernels.adamw_ref")


def _opts() -> dict:
    # enable_fp_fusion is a compile option on GPU; the interpreter ignores it.
    return {"enable_fp_fusion": False} if interpreting() else {
        "enable_fp_fusion": False, "num_warps": _WARPS}


def _arg(t: torch.Tensor) -> torch.Tensor:
    """bf16 tensors go to the kernel as their int16 bit patterns."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def adamw_step_triton(param, grad, exp_avg, exp_avg_sq, compensation=None, *, step: int,
                      lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                      adamw: bool = True, rounding: str = "nearest", seed: int = 0) -> None:
    """Triton twin of :func:`adamw_ref.adamw_step_ref` (same arguments, same results)."""
    _require_triton()
    p, g, m, v, c = check_args(param, grad, exp_avg, exp_avg_sq, compensation, step=step,
                               beta1=beta1, beta2=beta2, rounding=rounding)
    sc = scalars(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                 weight_decay=weight_decay, adamw=adamw)
    n = p.numel()
    if n == 0:
        return
    bf16 = torch.bfloat16
    grid = (triton.cdiv(n, _TILE),)
    _adamw_kernel[grid](
        _arg(p), _arg(g), _arg(m), _arg(v), _arg(c) if c is not None else _arg(p), n,
        sc.decay, sc.wd, sc.w1, sc.w1m1, sc.b2, sc.w2, sc.bc2s, sc.eps, sc.nss,
        hash_key(seed) if rounding == "stochastic" else 0,
        P_BF16=p.dtype == bf16, G_BF16=g.dtype == bf16, M_BF16=m.dtype == bf16,
        V_BF16=v.dtype == bf16, WD_MODE=sc.wd_mode, LERP_SMALL=sc.lerp_small,
        ROUND=_ROUND[rounding], TILE=_TILE, **_opts())
