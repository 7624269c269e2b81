"""Fused Adam / AdamW step for bf16 (or fp32) master weights: the pure-torch reference twin.

:func:`adamw_step_ref` defines the numerics; the Triton kernel in ``adamw_triton`` reproduces
them bit for bit (every value except the payload of a NaN, which is unspecified). It is also the
engine's CPU path, so it works in chunks of ``CHUNK`` elements (bounded fp32/fp64 temporaries).

Tensors
-------
``param`` (bf16 or fp32), ``grad`` (bf16, fp16, fp32 or fp64; read only), ``exp_avg`` and
``exp_avg_sq`` (bf16 or fp32, each on its own) and, for ``rounding="kahan"`` only,
``compensation`` (bf16): contiguous, the same numel (may be 0) and device; they are read as flat
arrays and updated in place.

Arithmetic
----------
All in fp32, each operation rounded once (IEEE round to nearest even: ``sqrt`` too), in this
order; ``step`` is the step count after the increment (1 on the first step). The scalars are
computed on the host in Python floats, as torch does for a non-capturable Adam, and then
rounded to fp32::

    decay = fp32(1 - lr * wd)     w1 = fp32(1 - beta1)    b2 = fp32(beta2)   w2 = fp32(1 - beta2)
    bc2s  = fp32((1 - beta2**step) ** 0.5)   nss = fp32(-(lr / (1 - beta1**step)))   e = fp32(eps)

    p = float(param)  (+ float(compensation) with kahan)
    g = float(grad)
    Adam (adamw=False), wd != 0:  g = fma(p, wd, g)         # grad.add(param, alpha=wd)
    AdamW (adamw=True), wd != 0:  p = p * decay            # param.mul_(1 - lr*wd)
    d = g - m
    m = fma(d, w1, m) if w1 < 0.5, else fma(d, w1 - 1, g)  # exp_avg.lerp_(grad, w1)
    v = fma(w2 * g, g, v * b2)                   # exp_avg_sq.mul_(b2).addcmul_(g, g, w2)
    denom = sqrt(v) / bc2s + e                   # (exp_avg_sq.sqrt() / bc2s).add_(eps)
    p = p + (nss * m) / denom                    # param.addcdiv_(exp_avg, denom, value=-ss)

``fma`` rounds once. These are the operations of torch's ``_single_tensor_adam`` with the
roundings its fp32 kernels have on CUDA and on x86 CPUs with AVX2/AVX512 (``lerp``,
``add(alpha=)`` and ``addcmul`` are fused multiply-adds there). Known deviations from torch,
each at most one fp32 rounding of one operation:

* ``sqrt``: torch's fp32 ``sqrt`` on CPU is not correctly rounded (MKL vector math; about a
  third of its results are one ulp away), so ``denom`` and then ``param`` differ from
  ``torch.optim.Adam/AdamW`` on CPU in the last bit now and then; with torch's CPU sqrt
  substituted, the twin equals them bit for bit on an AVX2/AVX512 CPU
  (tests/test_adamw_kernels.py checks both);
* torch's CPU kernels built without FMA (``ATEN_CPU_CAPABILITY=default``) round the lerp, the
  L2 add and the addcmul twice;
* torch on CUDA divides by the scalar ``bc2s`` as a multiplication by its reciprocal;
* torch with bf16 states computes from the bf16-rounded ``exp_avg``/``exp_avg_sq``; here the
  update uses the fp32 ``m`` and ``v`` and only their storage is rounded (as DeepSpeed's
  FusedAdam does).

Storage
-------
``m`` and ``v`` are stored in their dtypes (bf16: round to nearest even). ``param``:

* ``"nearest"``: ``param = rne_bf16(p)`` (fp32 params: ``param = p``; the only mode for them).
  DeepSpeed's FusedAdam on bf16 params: updates below half a bf16 ulp are lost.
* ``"kahan"``: ``param = rne_bf16(p)``; ``compensation = rne_bf16(p - float(param))``, so
  ``float(param) + float(compensation)`` carries the lost low bits into the next step.
* ``"stochastic"``: with ``u`` the fp32 bit pattern of ``p`` (as int32) and ``r`` in
  [0, 65536) from :func:`hash16`, ``param`` gets the high 16 bits of ``u + r``: rounding away
  from zero with probability (low 16 bits of u) / 65536, so ``E[param] = p`` exactly.
  Infinities stay infinite; a finite value above the largest bf16 may round to infinity (as
  round-to-nearest does above the midpoint). Pass a new ``seed`` each step.

bf16 stores round to nearest even without flushing subnormals: the kernel with integer
arithmetic on the fp32 bits ``u``, ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``, the twin with
torch's conversion (the same rounding). NaN stays NaN (its payload is unspecified: the kernel
stores 0x7FC0, torch's CPU conversion 0xFFFF on x86 builds).

Cost of the twin: torch has no fp32 fma, so :func:`fma32` computes it in fp64 (exact product,
one rounded sum, and an exact TwoSum redo for the rare sums that land on an fp32 midpoint);
with :func:`sqrt32` this makes a step about 2-2.5x the time of torch's fp32 ``AdamW`` on one
CPU core (bf16 params with fp32 states: ~2.5x; stochastic adds the integer hash: ~3.5x;
measured on 2M elements on the 2-core x86 development machine).

Stochastic rounding hash
------------------------
``r = fmix32((index * 0x9E3779B1 + key) mod 2**32) >> 16`` with ``key = (seed * 0x85EBCA77)
mod 2**32`` and ``fmix32`` the murmur3 finalizer; ``index`` is the element's position in the
flat tensor (mod 2**32). uint32 arithmetic, emulated here in int64 (each product taken with
the constant as a signed 32-bit value, so it stays below 2**63 in magnitude).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["CHUNK", "ROUNDINGS", "AdamScalars", "adamw_step_ref", "check_args", "fma32",
           "hash16", "hash_key", "scalars", "sqrt32"]

CHUNK = 1 << 18
"""Elements per chunk of the twin: its fp32/fp64 temporaries stay near the CPU's caches (2 MB
each; measured 2-3x faster than 1 << 20 chunks on a 2-core x86 machine)."""

ROUNDINGS = ("nearest", "kahan", "stochastic")
_STATE_DTYPES = (torch.bfloat16, torch.float32)
_GRAD_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)

_M32 = 0xFFFFFFFF
_IDX_MUL = 0x9E3779B1
_SEED_MUL = 0x85EBCA77
_FMIX1 = 0x85EBCA6B
_FMIX2 = 0xC2B2AE35


def _f32(x: float) -> float:
    """x rounded to the nearest fp32 value (as torch casts a Python scalar for fp32 kernels)."""
    return torch.tensor(x, dtype=torch.float64).to(torch.float32).item()


class AdamScalars(NamedTuple):
    """The fp32 constants of one step (see the module docstring); ``wd_mode``: 0 none,
    1 decoupled (AdamW), 2 L2 (Adam); ``lerp_small``: ``w1 < 0.5`` (torch's lerp branch)."""
    wd_mode: int
    decay: float
    wd: float
    w1: float
    w1m1: float
    b2: float
    w2: float
    bc2s: float
    eps: float
    nss: float
    lerp_small: bool


def scalars(*, step: int, lr: float, beta1: float, beta2: float, eps: float,
            weight_decay: float, adamw: bool) -> AdamScalars:
    bc1 = 1 - beta1 ** step
    bc2 = 1 - beta2 ** step
    wd_mode = 0 if weight_decay == 0 else (1 if adamw else 2)
    w1 = _f32(1 - beta1)
    return AdamScalars(wd_mode=wd_mode, decay=_f32(1 - lr * weight_decay), wd=_f32(weight_decay),
                       w1=w1, w1m1=w1 - 1.0, b2=_f32(beta2), w2=_f32(1 - beta2),
                       bc2s=_f32(bc2 ** 0.5), eps=_f32(eps), nss=_f32(-(lr / bc1)),
                       lerp_small=abs(w1) < 0.5)


def hash_key(seed: int) -> int:
    """The uint32 key of a seed (host side)."""
    return (int(seed) * _SEED_MUL) & _M32


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for int64 0 <= a < 2**32: c is taken as a signed 32-bit value
    (c - 2**32 when c >= 2**31), so |a * c| < 2**63 never overflows int64, and ``& M32`` of the
    two's complement product keeps its low 32 bits."""
    c = c - (1 << 32) if c >= 1 << 31 else c
    return (a * c).bitwise_and_(_M32)


def hash16(index: torch.Tensor, seed: int) -> torch.Tensor:
    """r in [0, 65536) (int64) for element indices ``index``; see the module docstring."""
    x = _mul32(index.to(torch.int64) & _M32, _IDX_MUL)
    x.add_(hash_key(seed)).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 16)
    x = _mul32(x, _FMIX1)
    x.bitwise_xor_(x >> 13)
    x = _mul32(x, _FMIX2)
    x.bitwise_xor_(x >> 16)
    return x.bitwise_right_shift_(16)


_SUB_EXP = 0x3810000000000000  # bits of 2**-126 as fp64: below it, fp32 results are subnormal


def fma32(a, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``fma(a, b, c)`` rounded once -> new fp32 tensor (``a``: fp32 tensor or a Python float
    holding an fp32 value; ``b``, ``c`` fp32).

    ``a*b`` is exact in fp64 and ``s = a*b + c`` is rounded once there; rounding ``s`` to fp32
    then gives the fma except where ``s`` lies exactly halfway between two fp32 values (or in the
    fp32 subnormal range) without being exact: those rare elements are redone with an exact
    TwoSum and rounding to odd, which makes the second rounding correct.
    """
    s = b.to(torch.float64)
    s.mul_(a)
    s.add_(c)
    bits = s.view(torch.int64)
    suspect = (bits & 0x1FFFFFFF) == 0x10000000
    mag = bits & 0x7FFFFFFFFFFFFFFF
    suspect |= (mag > 0) & (mag < _SUB_EXP)
    idx = suspect.nonzero().squeeze(1)
    if idx.numel():
        a_s = a if isinstance(a, float) else a[idx].to(torch.float64)
        p = b[idx].to(torch.float64) * a_s
        cs = c[idx].to(torch.float64)
        t = p + cs
        bv = t - p
        err = (p - (t - bv)) + (cs - bv)  # t + err == p + cs exactly (TwoSum)
        tb = t.view(torch.int64)
        fix = ((tb & 1) == 0) & (err != 0) & torch.isfinite(t) & torch.isfinite(err)
        toward = torch.where((err > 0) == (t > 0), 1, -1)
        tb += toward * fix  # round to odd: the odd neighbour on the side of the exact sum
        s[idx] = t
    return s.to(torch.float32)


def sqrt32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 square root -> new fp32 tensor.

    torch's fp32 ``sqrt`` on CPU is not correctly rounded (MKL's vector math on x86 builds:
    about a third of the results are one ulp off). The fp64 square root rounded to fp32 is: a
    faithful fp64 result is within 2**-52 (relative) of sqrt(x), while sqrt of an fp32 value
    is never within 2**-51 of an fp32 rounding midpoint.
    """
    return x.to(torch.float64).sqrt_().to(torch.float32)


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t.view(-1)


def check_args(param, grad, exp_avg, exp_avg_sq, compensation, *, step, beta1, beta2,
               rounding):
    """Validate; -> the flat views ``(param, grad, exp_avg, exp_avg_sq, compensation)``."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    named = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if rounding == "kahan":
        if compensation is None:
            raise ValueError("rounding='kahan' needs a compensation tensor (bf16, numel of param)")
        named["compensation"] = compensation
    elif compensation is not None:
        raise ValueError(f"compensation is only used with rounding='kahan', not {rounding!r}")
    flat = {k: _flat(t, k) for k, t in named.items()}
    n = flat["param"].numel()
    dev = flat["param"].device
    for k, t in flat.items():
        if t.numel() != n:
            raise ValueError(f"{k} has {t.numel()} elements, param has {n}")
        if t.device != dev:
            raise ValueError(f"{k} is on {t.device}, param on {dev}")
    if flat["param"].dtype not in _STATE_DTYPES:
        raise ValueError(f"param must be bf16 or fp32, got {flat['param'].dtype}")
    if flat["param"].dtype == torch.float32 and rounding != "nearest":
        raise ValueError(f"rounding={rounding!r} is for bf16 params; fp32 params use 'nearest'")
    if flat["grad"].dtype not in _GRAD_DTYPES:
        raise ValueError(f"grad must be a floating dtype, got {flat['grad'].dtype}")
    for k in ("exp_avg", "exp_avg_sq"):
        if flat[k].dtype not in _STATE_DTYPES:
            raise ValueError(f"{k} must be bf16 or fp32, got {flat[k].dtype}")
    if "compensation" in flat and flat["compensation"].dtype != torch.bfloat16:
        raise ValueError(f"compensation must be bf16, got {flat['compensation'].dtype}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step is the count after the increment (an int >= 1), got {step!r}")
    for k, b in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{k} must be in [0, 1), got {b}")
    return (flat["param"], flat["grad"], flat["exp_avg"], flat["exp_avg_sq"],
            flat.get("compensation"))


def _work(t: torch.Tensor) -> torch.Tensor:
    """An fp32 tensor to compute in: t itself when fp32 (updated in place), else a copy."""
    return t if t.dtype == torch.float32 else t.to(torch.float32)


@torch.no_grad()
def adamw_step_ref(param, grad, exp_avg, exp_avg_sq, compensation=None, *, step: int,
                   lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   adamw: bool = True, rounding: str = "nearest", seed: int = 0) -> None:
    """One Adam (``adamw=False``: L2 weight decay) / AdamW step in place; see the module
    docstring for the exact numerics. ``step`` counts from 1."""
    p_all, g_all, m_all, v_all, c_all = check_args(
        param, grad, exp_avg, exp_avg_sq, compensation, step=step, beta1=beta1, beta2=beta2,
        rounding=rounding)
    sc = scalars(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                 weight_decay=weight_decay, adamw=adamw)
    n = p_all.numel()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        _chunk(p_all[lo:hi], g_all[lo:hi], m_all[lo:hi], v_all[lo:hi],
               None if c_all is None else c_all[lo:hi], lo, sc, rounding, seed)


def _chunk(param, grad, exp_avg, exp_avg_sq, comp, offset, sc: AdamScalars, rounding, seed):
    p = _work(param)
    if comp is not None:
        p.add_(comp)
    g = grad if grad.dtype == torch.float32 else grad.to(torch.float32)  # read only
    m = _work(exp_avg)
    v = _work(exp_avg_sq)
    if sc.wd_mode == 2:
        g = fma32(sc.wd, p, g)
    elif sc.wd_mode == 1:
        p.mul_(sc.decay)
    d = g - m
    m.copy_(fma32(sc.w1, d, m) if sc.lerp_small else fma32(sc.w1m1, d, g))
    del d
    v.mul_(sc.b2)
    v.copy_(fma32(g * sc.w2, g, v))
    del g
    denom = sqrt32(v)
    denom.div_(sc.bc2s).add_(sc.eps)
    upd = m * sc.nss
    upd.div_(denom)
    del denom
    p.add_(upd)
    del upd
    for src, dst in ((m, exp_avg), (v, exp_avg_sq)):
        if dst is not src:
            dst.copy_(src)  # bf16: round to nearest even
    if param is p:  # fp32 param: updated in place already
        return
    if rounding == "nearest":
        param.copy_(p)
    elif rounding == "kahan":
        param.copy_(p)
        p.sub_(param)  # exact bf16 -> fp32, one rounding
        comp.copy_(p)
    else:
        nan = torch.isnan(p)
        bits = p.view(torch.int32)
        idx = torch.arange(offset, offset + p.numel(), dtype=torch.int64, device=p.device)
        bits.add_(hash16(idx, seed).to(torch.int32))
        bits.bitwise_and_(-65536)  # keep the high 16 bits: exact in bf16
        p.masked_fill_(nan, math.nan)
        param.copy_(p)
