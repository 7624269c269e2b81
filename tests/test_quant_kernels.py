"""Block-quantization kernels: Triton (compiled on CUDA, interpreter without it) vs the
pure-torch twins. Kernels run on DEV; the twins on CPU; results are compared on CPU."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from triton_kernels.runtime import use_interpreter_if_no_cuda

INTERPRET = use_interpreter_if_no_cuda()  # must precede any `import triton`
DEV = "cpu" if INTERPRET else "cuda"

from triton_kernels import dispatch
from triton_kernels.quantize_ref import (
    QMAX,
    dequantize_ref,
    dequantize_sum_ref,
    hash_uniform,
    quantize_ref,
    seed_key,
    unpack_int4_ref,
)

try:
    import triton  # noqa: F401

    from triton_kernels import quantize_triton as _qt
    HAS_TRITON = _qt.HAS_TRITON
except ModuleNotFoundError:  # triton not installed; test_kernels_import_when_triton_is_installed
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed; "
                                  "Triton-vs-twin comparisons need it")


def quantize_triton(x, *args, **kwargs):
    codes, scales = _qt.quantize_triton(x.to(DEV), *args, **kwargs)
    return codes.cpu(), scales.cpu()


def dequantize_triton(codes, scales, *args):
    return _qt.dequantize_triton(codes.to(DEV), scales.to(DEV), *args).cpu()


def dequantize_sum_triton(codes, scales, *args):
    return _qt.dequantize_sum_triton(codes.to(DEV), scales.to(DEV), *args).cpu()

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = [8, 4]


def _gen(n, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * scale
    # a few outliers and exact zeros so blocks have varied ranges
    x[:: 97] *= 10.0
    x[3:: 131] = 0.0
    return x.to(dtype)


def _same(a, b):
    """Bit-exact equality, NaNs compared by position (payloads may differ)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        assert torch.equal(na, nb), "NaN positions differ"
        assert torch.equal(a[~na], b[~nb]), (a[~na] - b[~nb]).abs().max()
    else:
        assert torch.equal(a, b), (a != b).nonzero()[:10]


def _both(x, bits, block, stochastic=False, seed=0):
    c1, s1 = quantize_ref(x, bits, block, stochastic, seed)
    c2, s2 = quantize_triton(x, bits, block, stochastic, seed)
    _same(c1, c2)
    _same(s1, s2)
    return c1, s1


def _max_err_ratio(x, deq, scales, block):
    """max over elements of |x - deq| / scale_block (scale 0 blocks must be exact)."""
    xf = x.float()
    n = xf.numel()
    s = scales.repeat_interleave(block)[:n]
    err = (xf - deq).abs()
    assert torch.all(err[s == 0] == 0)
    nz = s > 0
    return (err[nz] / s[nz]).max().item() if nz.any() else 0.0


# ---------------------------------------------------------------------------
# Triton vs twin
# ---------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,block", [(4096, 256), (3000, 1024), (2500, 32)])
def test_quant_dequant_matches_twin(bits, dtype, n, block):
    x = _gen(n, dtype, seed=n + bits)
    c, s = _both(x, bits, block)
    nb = -(-n // block)
    assert s.shape == (nb,) and s.dtype == torch.float32
    assert c.numel() == nb * block * bits // 8
    assert c.dtype == (torch.int8 if bits == 8 else torch.uint8)
    _same(dequantize_ref(c, s, bits, block, n), dequantize_triton(c, s, bits, block, n))


@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_dequant_low_precision_output(bits, out_dtype):
    # Compared in fp32. Compiled kernels round the fp32 product to nearest-even like torch's
    # cast: exact. The interpreter truncates bf16 stores: one ulp of the output dtype there.
    n, block = 2048, 256
    c, s = quantize_ref(_gen(n, seed=5), bits, block)
    a = dequantize_ref(c, s, bits, block, n, out_dtype)
    b = dequantize_triton(c, s, bits, block, n, out_dtype)
    assert a.dtype == b.dtype == out_dtype
    if INTERPRET:
        ulp = torch.finfo(out_dtype).eps
        torch.testing.assert_close(b.float(), a.float(), rtol=ulp, atol=0)
    else:
        _same(b.float(), a.float())


@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1])
def test_stochastic_matches_twin(bits, seed):
    x = _gen(3000, torch.float32, seed=seed % 1000)
    c, _ = _both(x, bits, 256, stochastic=True, seed=seed)
    c_other, _ = quantize_ref(x, bits, 256, stochastic=True, seed=seed + 1)
    assert not torch.equal(c, c_other)


@needs_triton
@pytest.mark.parametrize("bits", BITS)
def test_dequantize_sum_matches_twin(bits):
    block, numel = 256, 2000  # ragged: 8 blocks, last one partial
    K = 4
    cs, ss = [], []
    for k in range(K):
        c, s = quantize_ref(_gen(numel, seed=100 + k, scale=1.0 + k), bits, block)
        cs.append(c)
        ss.append(s)
    codes, scales = torch.stack(cs), torch.stack(ss)
    a = dequantize_sum_ref(codes, scales, bits, block, numel)
    b = dequantize_sum_triton(codes, scales, bits, block, numel)
    _same(a, b)
    # sequential fp32 summation of the individually dequantized chunks
    acc = torch.zeros(numel)
    for k in range(K):
        acc = acc + dequantize_ref(cs[k], ss[k], bits, block, numel)
    _same(a, acc)
    _same(dequantize_sum_triton(codes[:1], scales[:1], bits, block, numel),
          dequantize_ref(cs[0], ss[0], bits, block, numel))


@needs_triton
@pytest.mark.parametrize("bits", BITS)
def test_zero_blocks(bits):
    x = torch.zeros(1500)
    x[600:700] = torch.linspace(-1, 1, 100)  # block 2 (of 256) is non-zero
    c, s = _both(x, bits, 256)
    assert s[2] > 0 and torch.all(s[torch.arange(len(s)) != 2] == 0)
    d = dequantize_triton(c, s, bits, 256, 1500)
    assert torch.isfinite(d).all()
    assert torch.all(d[:512] == 0) and torch.all(d[768:] == 0)
    c0, s0 = _both(torch.zeros(700, dtype=torch.bfloat16), bits, 256)
    assert torch.all(c0 == 0) and torch.all(s0 == 0)


@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n,block", [(1, 256), (31, 32), (100, 1024), (257, 256), (1000, 512)])
def test_ragged_tail(bits, n, block):
    x = _gen(n, torch.float16, seed=n)
    c, s = _both(x, bits, block)
    nb = -(-n // block)
    assert s.numel() == nb
    q = c.to(torch.int32) if bits == 8 else unpack_int4_ref(c)
    assert q.numel() == nb * block and torch.all(q[n:] == 0)  # padding codes are zero
    d = dequantize_triton(c, s, bits, block, n)
    assert d.shape == (n,)
    _same(d, dequantize_ref(c, s, bits, block, n))
    assert _max_err_ratio(x, d, s, block) <= 0.5 * (1 + 1e-5)


@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mag", [1e30, 1e-30, 3e38])
def test_extreme_magnitudes(bits, mag):
    x = _gen(2048, torch.float32, seed=3)
    x = x / x.abs().max() * mag  # absmax of the tensor == mag
    assert torch.isfinite(x).all()
    c, s = _both(x, bits, 512)
    assert torch.isfinite(s).all() and (s > 0).all()
    d = dequantize_triton(c, s, bits, 512, 2048)
    _same(d, dequantize_ref(c, s, bits, 512, 2048))
    assert torch.isfinite(d).all()
    assert _max_err_ratio(x, d, s, 512) <= 0.5 * (1 + 1e-5)


@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_finite_stays_non_finite(bits, bad, dtype):
    n, block = 1200, 256
    x = _gen(n, dtype, seed=9)
    x[300] = bad       # block 1
    x[1190] = bad      # last (partial) block
    for stochastic in (False, True):
        c, s = _both(x, bits, block, stochastic=stochastic, seed=4)
        assert torch.isnan(s[1]) and torch.isnan(s[-1])
        assert torch.isfinite(s[[0, 2, 3]]).all()
        for deq in (dequantize_triton, dequantize_ref):
            d = deq(c, s, bits, block, n)
            assert not torch.isfinite(d[256:512]).any()
            assert not torch.isfinite(d[1024:]).any()
            assert torch.isfinite(d[:256]).all() and torch.isfinite(d[512:1024]).all()
            # an fp16 overflow check on the result still sees it
            h = deq(c, s, bits, block, n, torch.float16)
            assert not torch.isfinite(h).all()
        summed = dequantize_sum_triton(torch.stack([c, c]), torch.stack([s, s]), bits, block, n)
        assert not torch.isfinite(summed[256:512]).any()


@needs_triton
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n,block", [(777, 64), (2048, 256), (4000, 1024)])
def test_error_bound_property(bits, n, block):
    for trial in range(2):
        x = _gen(n, torch.float32, seed=1000 * trial + n, scale=10.0 ** (3 * trial - 2))
        c, s = _both(x, bits, block)
        d = dequantize_triton(c, s, bits, block, n)
        assert _max_err_ratio(x, d, s, block) <= 0.5 * (1 + 1e-5)  # RTN: <= scale/2
        cs, ss = _both(x, bits, block, stochastic=True, seed=trial)
        ds = dequantize_triton(cs, ss, bits, block, n)
        assert _max_err_ratio(x, ds, ss, block) < 1.0  # stochastic: < scale


# ---------------------------------------------------------------------------
# Twin-only properties
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bits", BITS)
def test_round_half_to_even(bits):
    q = QMAX[bits]
    vals = [float(q), 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]
    x = torch.tensor(vals + [0.0] * (32 - len(vals)))
    c, s = quantize_ref(x, bits, 32)
    assert s.item() == 1.0
    codes = c.to(torch.int32) if bits == 8 else unpack_int4_ref(c)
    assert codes[:8].tolist() == [q, 0, 2, 2, 0, -2, -2, 4]
    if HAS_TRITON:
        _both(x, bits, 32)


@pytest.mark.parametrize("bits", BITS)
def test_stochastic_unbiased(bits):
    n, block = 8192, 256
    x = _gen(n, seed=21)
    c0, s = quantize_ref(x, bits, block)
    scale = s.repeat_interleave(block)[:n]
    S = 64
    acc = torch.zeros(n, dtype=torch.float64)
    for seed in range(S):
        c, s2 = quantize_ref(x, bits, block, stochastic=True, seed=seed)
        assert torch.equal(s2, s)
        acc += dequantize_ref(c, s2, bits, block, n).double()
    err = (acc / S - x.double()) / scale.double()
    # per element: std of the mean <= 0.5/sqrt(S) = 0.0625
    assert err.abs().max() < 0.4
    # global mean error: essentially zero (RTN bias would not average out like this)
    assert abs(err.mean().item()) < 5e-3
    # single-shot error of stochastic rounding is larger than RTN's on average
    d0 = dequantize_ref(c0, s, bits, block, n)
    assert ((d0 - x).abs() / scale).max() <= 0.5 * (1 + 1e-5)


def test_hash_matches_python_uint32():
    def lowbias32(v):
        v &= 0xFFFFFFFF
        v ^= v >> 16
        v = (v * 0x7FEB352D) & 0xFFFFFFFF
        v ^= v >> 15
        v = (v * 0x846CA68B) & 0xFFFFFFFF
        v ^= v >> 16
        return v

    idx = [0, 1, 2, 255, 65535, 65536, 2**31 - 1, 2**31 + 5, 2**32 - 1]
    for seed in (0, 7, 2**32 - 1):
        u = hash_uniform(torch.tensor(idx, dtype=torch.int64), seed)
        exp = [(lowbias32(lowbias32(i) ^ seed_key(seed)) >> 8) * 2.0 ** -24 for i in idx]
        assert u.tolist() == exp
        assert (u >= 0).all() and (u < 1).all()


def test_quantized_nbytes():
    assert dispatch.quantized_nbytes(1024, 8, 256) == 1024 + 4 * 4
    assert dispatch.quantized_nbytes(1024, 4, 256) == 512 + 4 * 4
    assert dispatch.quantized_nbytes(1000, 8, 256) == 1024 + 4 * 4  # padded tail
    assert dispatch.quantized_nbytes(1, 4, 32) == 16 + 4
    for bits in BITS:
        c, s = quantize_ref(torch.randn(1000), bits, 256)
        assert c.numel() * c.element_size() + s.numel() * 4 == dispatch.quantized_nbytes(1000, bits, 256)
    with pytest.raises(ValueError):
        dispatch.quantized_nbytes(10, 8, 48)
    with pytest.raises(ValueError):
        dispatch.quantized_nbytes(10, 2, 64)


def test_dispatch(monkeypatch):
    x = _gen(1000, seed=2)
    monkeypatch.delenv("ZEROLITE_FORCE_TRITON", raising=False)
    assert not dispatch.use_triton(x)  # CPU tensor -> twin
    c, s = dispatch.quantize(x, 4, 256)
    _same(c, quantize_ref(x, 4, 256)[0])
    if HAS_TRITON and not INTERPRET:  # CUDA tensors take the compiled kernels
        xc = x.to(DEV)
        assert dispatch.use_triton(xc)
        cc, sc = dispatch.quantize(xc, 4, 256)
        _same(cc.cpu(), c)
        _same(sc.cpu(), s)
    if HAS_TRITON and INTERPRET:  # forcing Triton on CPU tensors needs the interpreter
        monkeypatch.setenv("ZEROLITE_FORCE_TRITON", "1")
        assert dispatch.use_triton(x)
        c2, s2 = dispatch.quantize(x, 4, 256, stochastic=True, seed=3)
        _same(c2, quantize_ref(x, 4, 256, True, 3)[0])
        _same(dispatch.dequantize(c2, s2, 4, 256, 1000), dequantize_ref(c2, s2, 4, 256, 1000))
        cc, ss = torch.stack([c, c2]), torch.stack([s, s2])
        _same(dispatch.dequantize_sum(cc, ss, 4, 256, 1000), dequantize_sum_ref(cc, ss, 4, 256, 1000))


def test_package_import_does_not_import_triton():
    code = ("import sys; import triton_kernels; from triton_kernels import dispatch; "
            "assert 'triton' not in sys.modules, 'triton imported eagerly'")
    env = {k: v for k, v in os.environ.items() if k != "ZEROLITE_FORCE_TRITON"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------
# How the kernels are picked: compiled on CUDA, never a silent fallback
# ---------------------------------------------------------------------------
def test_interpreter_only_without_cuda():
    assert INTERPRET is (not torch.cuda.is_available())
    if HAS_TRITON:
        assert _qt.TUNED is (not INTERPRET)  # autotuned tiles exactly when compiled


def test_kernels_import_when_triton_is_installed():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from triton_kernels import quantize_triton as qt

    assert qt.IMPORT_ERROR is None and qt.HAS_TRITON, qt.IMPORT_ERROR
    assert dispatch.triton_available()


_BROKEN_KERNELS = """
import importlib.abc, sys, warnings
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton_kernels.quantize_triton":
            raise SyntaxError("kernel did not build")
sys.meta_path.insert(0, Broken())
from triton_kernels import dispatch
import torch
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    assert dispatch.triton_available() is False
    assert dispatch.triton_available() is False
    dispatch.use_triton(torch.zeros(1))
msgs = [str(w.message) for w in seen]
assert len(msgs) == 1 and "kernel did not build" in msgs[0], msgs
"""


def test_broken_kernels_warn_once():
    # triton_kernels.quantize_triton raising on import: the twins run and one warning says why.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "ZEROLITE_FORCE_TRITON"}
    r = subprocess.run([sys.executable, "-c", _BROKEN_KERNELS], cwd=root, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
