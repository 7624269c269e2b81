"""Block-wise symmetric quantization (ZeRO++ qgZ style): pure-torch reference twins.

These functions define the numerics; the Triton kernels in ``quantize_triton``
must reproduce them bit-exactly (codes, scales, dequantized fp32 values).

Format
------
* Input: a tensor of ``numel`` elements (fp32 / bf16 / fp16, flattened), upcast
  to fp32 exactly before any arithmetic.
* Blocks of ``block_size`` consecutive elements (power of two, >= 32).
  ``nblocks = ceil(numel / block_size)``.
* **Ragged tail**: the last block may be partial; it is conceptually padded with
  zeros.  The codes tensor always covers the *padded* length
  ``nblocks * block_size`` elements (padding codes are 0), so every block has the
  same byte size on the wire.  Dequantization takes ``numel`` and drops the
  padding.
* ``scales``: fp32 ``[nblocks]``, ``scale = fl32(absmax_block / qmax)`` (IEEE
  round-to-nearest division), ``qmax = 127`` (int8) or ``7`` (int4).
* Codes: ``q = clamp(rne(fl32(x / scale)), -qmax, qmax)`` (round half to even),
  or with stochastic rounding ``q = clamp(floor(fl32(fl32(x / scale) + u)), ...)``
  where ``u = (h >> 8) * 2**-24`` in [0, 1) and ``h`` is a uint32 counter-based
  hash of ``(seed, element index in the padded flat array)`` (see
  :func:`hash_uniform`).
* int8 codes: ``torch.int8`` ``[nblocks * block_size]``.
  int4 codes: ``torch.uint8`` ``[nblocks * block_size // 2]``; byte ``j`` holds
  element ``2j`` in its low nibble and element ``2j+1`` in its high nibble, each
  as a 4-bit two's complement value in [-7, 7].
* **All-zero block** (or a block whose scale underflows to 0): scale 0, codes 0,
  no division by zero; dequantizes to exact zeros.
* **Non-finite input**: a block containing NaN or +-Inf gets ``scale = NaN`` and
  codes 0, so *every* dequantized element of that block is NaN
  (``0 * NaN = NaN``).  A downstream overflow / inf-nan check on the result
  therefore still fires; finite neighbouring blocks are unaffected.
  Corner case: a finite block whose absmax is within ~1 ulp of FLT_MAX may
  dequantize its extreme element to +-Inf (``127 * fl(absmax/127)`` rounds up);
  this errs on the side of an overflow check firing.
* Dequantization: ``fl32(float(q) * scale)`` then cast to ``out_dtype``.
* Fused dequantize-sum of K chunks: ``acc = 0; for k in 0..K-1: acc = fl32(acc
  + fl32(q_k * s_k))`` (sequential, fp32, no FMA contraction).

Error bound
-----------
Round-to-nearest: ``|x - dequant(quant(x))| <= scale / 2 = absmax_block /
(2 * qmax)`` per element (up to a few fp32 ulps of rounding in the scale, the
division and the product).  Stochastic rounding: ``|error| < scale`` and
``E[dequant] ~= x`` (unbiased up to the 2**-24 granularity of ``u``).
"""

from __future__ import annotations


import torch

__all__ = [
    "QMAX",
    "check_args",
    "num_blocks",
    "hash_uniform",
    "seed_key",
    "quantize_ref",
    "dequantize_ref",
    "dequantize_sum_ref",
    "unpack_int4_ref",
]

QMAX = {8: 127, 4: 7}
_M32 = 0xFFFFFFFF


def check_args(bits: int, block_size: int) -> int:
    if bits not in QMAX:
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    if block_size < 32 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 32, got {block_size}")
    return QMAX[bits]


def num_blocks(numel: int, block_size: int) -> int:
    return (numel + block_size - 1) // block_size


# ---------------------------------------------------------------------------
# Counter-based hash (uint32 arithmetic emulated in int64 without overflow).
# lowbias32 (Wellons): x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; x ^= x>>16
# ---------------------------------------------------------------------------
_H1 = 0x7FEB352D
_H2 = 0x846CA68B


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    # (a * c) mod 2**32 for 0 <= a < 2**32, split so products stay < 2**48.
    lo = a * (c & 0xFFFF)
    hi = ((a * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _H1)
    x = x ^ (x >> 15)
    x = _mul32(x, _H2)
    x = x ^ (x >> 16)
    return x


def _lowbias32_int(x: int) -> int:
    x &= _M32
    x ^= x >> 16
    x = (x * _H1) & _M32
    x ^= x >> 15
    x = (x * _H2) & _M32
    x ^= x >> 16
    return x


def seed_key(seed: int) -> int:
    """uint32 key derived from a user seed (computed on the host)."""
    return _lowbias32_int((int(seed) + 0x9E3779B9) & _M32)


def hash_uniform(idx: torch.Tensor, seed: int) -> torch.Tensor:
    """u in [0, 1) (fp32, multiples of 2**-24) for int element indices ``idx``.

    h = lowbias32(lowbias32(idx) ^ seed_key(seed)); u = (h >> 8) * 2**-24.
    """
    h = _lowbias32(idx.to(torch.int64) & _M32)
    h = _lowbias32(h ^ seed_key(seed))
    return (h >> 8).to(torch.float32) * (2.0 ** -24)


# ---------------------------------------------------------------------------
def quantize_ref(x: torch.Tensor, bits: int, block_size: int, stochastic: bool = False,
                 seed: int = 0):
    """Quantize ``x`` (flattened) -> ``(codes, scales)``; see module docstring."""
    qmax = check_args(bits, block_size)
    xf = x.reshape(-1).to(torch.float32)
    n = xf.numel()
    nb = num_blocks(n, block_size)
    padded = nb * block_size
    if padded != n:
        xf = torch.cat([xf, xf.new_zeros(padded - n)])
    xb = xf.view(nb, block_size)
    finite = torch.isfinite(xb)
    bad = (~finite).any(dim=1)
    absmax = torch.where(finite, xb.abs(), torch.zeros_like(xb)).amax(dim=1) if nb else xb.new_zeros(0)
    scales = absmax / float(qmax)
    scales = torch.where(bad, torch.full_like(scales, float("nan")), scales)
    valid = (scales > 0)[:, None]  # False for zero and NaN scales
    denom = torch.where(valid, scales[:, None], torch.ones_like(scales[:, None]))
    y = torch.where(valid, xb / denom, torch.zeros_like(xb))
    if stochastic:
        idx = torch.arange(padded, dtype=torch.int64, device=xf.device).view(nb, block_size)
        u = hash_uniform(idx, seed)
        q = torch.floor(y + u).clamp_(-qmax, qmax)
    else:
        q = torch.round(y.clamp(-qmax, qmax))  # round half to even
    q = q.to(torch.int32).reshape(-1)
    if bits == 8:
        codes = q.to(torch.int8)
    else:
        q2 = (q & 0xF).view(-1, 2)
        codes = (q2[:, 0] | (q2[:, 1] << 4)).to(torch.uint8)
    return codes, scales


def unpack_int4_ref(codes: torch.Tensor) -> torch.Tensor:
    """uint8 packed [..., m/2] -> int32 [..., m] with values in [-8, 7]."""
    b = codes.to(torch.int32)
    lo = ((b & 0xF) ^ 8) - 8
    hi = (((b >> 4) & 0xF) ^ 8) - 8
    return torch.stack([lo, hi], dim=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def _codes_to_float(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return codes.to(torch.float32)
    return unpack_int4_ref(codes).to(torch.float32)


def dequantize_ref(codes: torch.Tensor, scales: torch.Tensor, bits: int, block_size: int,
                   numel: int, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes * scale -> ``out_dtype`` tensor of ``numel`` elements (padding dropped)."""
    check_args(bits, block_size)
    q = _codes_to_float(codes.reshape(-1), bits)
    s = scales.reshape(-1).to(torch.float32).repeat_interleave(block_size)
    if q.numel() < numel or s.numel() < numel:
        raise ValueError("codes/scales too short for numel")
    return (q[:numel] * s[:numel]).to(out_dtype)


def dequantize_sum_ref(codes_2d: torch.Tensor, scales_2d: torch.Tensor, bits: int,
                       block_size: int, numel_per_chunk: int) -> torch.Tensor:
    """sum_k dequant(chunk k) in fp32, k = 0..K-1 sequentially -> fp32 [numel_per_chunk]."""
    check_args(bits, block_size)
    K = codes_2d.shape[0]
    acc = torch.zeros(numel_per_chunk, dtype=torch.float32, device=codes_2d.device)
    for k in range(K):
        acc = acc + dequantize_ref(codes_2d[k], scales_2d[k], bits, block_size, numel_per_chunk)
    return acc
