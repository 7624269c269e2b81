"""Fused Adam/AdamW step on bf16 (or fp32) master weights: the pure-torch twin against
torch.optim and against its own definition, and the Triton kernel (compiled on CUDA, the
interpreter without it) against the twin, bit for bit. The kernel runs on DEV, the twin on CPU;
results are compared on CPU."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from triton_kernels.runtime import use_interpreter_if_no_cuda

INTERPRET = use_interpreter_if_no_cuda()  # must precede any `import triton`
DEV = "cpu" if INTERPRET else "cuda"

from triton_kernels import adamw_ref, dispatch
from triton_kernels.adamw_ref import adamw_step_ref, fma32, hash16, sqrt32

try:
    import triton  # noqa: F401

    from triton_kernels import adamw_triton as _at
    HAS_TRITON = _at.HAS_TRITON
except ModuleNotFoundError:
    HAS_TRITON = False

# NaN / inf inputs (on purpose) make numpy warn inside the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed; "
                                  "Triton-vs-twin comparisons need it")
# torch's fp32 lerp / add(alpha=) / addcmul are fused multiply-adds on these CPU builds.
TORCH_CPU_FMA = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
KW = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
BF16, F32 = torch.bfloat16, torch.float32


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same(a, b):
    """Bitwise equal, except that any NaN equals any NaN (its payload is unspecified)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    na, nb = torch.isnan(a.float()), torch.isnan(b.float())
    assert torch.equal(na, nb), na.ne(nb).nonzero()[:10]
    diff = (_bits(a) != _bits(b)) & ~na
    assert not bool(diff.any()), (diff.nonzero()[:10].squeeze(1), a[diff][:5], b[diff][:5])


def _tensors(n, pdt=BF16, sdt=F32, gdt=F32, kahan=False, seed=0, special=False):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=g) * torch.logspace(-3, 1, n)
    grad = torch.randn(n, generator=g) * torch.logspace(-4, 2, n).flip(0)
    m = torch.randn(n, generator=g) * 0.1
    v = torch.rand(n, generator=g) * 0.01
    if special and n >= 16:  # zeros, fp32/bf16 subnormals, huge values, inf and NaN
        p[:4] = torch.tensor([0.0, -0.0, 1e-39, 3e38])
        grad[4:9] = torch.tensor([0.0, 1e-40, -3e-39, float("inf"), float("nan")])
        m[9:11] = torch.tensor([1e-41, -2e-39])
        v[11:13] = torch.tensor([0.0, 1e-42])
        p[13] = float("nan")
        p[14] = float("-inf")
    c = (torch.randn(n, generator=g) * 1e-3).to(BF16) if kahan else None
    return p.to(pdt), grad.to(gdt), m.to(sdt), v.to(sdt), c


def _clone(ts, device="cpu"):
    return [None if t is None else t.to(device, copy=True) for t in ts]


# ---------------------------------------------------------------------------------------------
# (a) fp32 params: the twin against torch.optim.Adam / AdamW


def _torch_run(p0, grads, adamw, wd, lr=1e-2):
    ref = p0.clone().requires_grad_(True)
    opt = (torch.optim.AdamW if adamw else torch.optim.Adam)(
        [ref], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, foreach=False)
    for g in grads:
        ref.grad = g.clone()
        opt.step()
    st = opt.state[ref]
    return ref.detach(), st["exp_avg"], st["exp_avg_sq"]


def _twin_run(p0, grads, adamw, wd, lr=1e-2):
    p, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    for step, g in enumerate(grads, 1):
        adamw_step_ref(p, g, m, v, step=step, lr=lr, beta1=0.9, beta2=0.999, eps=1e-8,
                       weight_decay=wd, adamw=adamw)
    return p, m, v


def _grads(n, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) * (1 + s) for s in range(steps)]


@pytest.mark.parametrize("adamw,wd", [(True, 0.1), (False, 0.1), (True, 0.0)])
def test_twin_matches_torch_adam_fp32(adamw, wd):
    """Within fp32 round-off: the one deviation on CPU is torch's sqrt (MKL, not correctly
    rounded: one ulp on ~1/3 of the elements), which moves denom by <= 2**-23 relative, so each
    step's update by <= ~2**-22 of |update| <= ~lr, plus one ulp of param where the final add
    then rounds the other way. Over `steps` steps: |dp| <= steps * (lr * 2**-20 + ulp(p)).
    Measured here: 1.3-1.5% of the params one ulp apart (at most 4.8e-7 at |p| ~ 4, 0.7 of the
    one-step bound)."""
    n, steps, lr = 6000, 12, 1e-2
    p0 = torch.randn(n) * 3
    grads = _grads(n, steps)
    tp, tm, tv = _torch_run(p0, grads, adamw, wd, lr)
    p, m, v = _twin_run(p0, grads, adamw, wd, lr)
    tol = steps * (lr * 2 ** -20 + 2 ** -22 * tp.abs())
    assert bool(((p - tp).abs() <= tol).all()), float((p - tp).abs().max())
    if adamw:  # m and v never see the param: bitwise
        assert torch.equal(m, tm) and torch.equal(v, tv)
    else:  # through wd * param only (L2): an ulp of m or v now and then (measured 1.2e-7)
        assert float((m - tm).abs().max()) <= 1e-6 and float((v - tv).abs().max()) <= 1e-6
    assert not torch.equal(p0, p)


@pytest.mark.skipif(not TORCH_CPU_FMA, reason="torch's CPU kernels round lerp/addcmul twice "
                    "on builds without FMA")
@pytest.mark.parametrize("adamw", [True, False])
def test_twin_is_torch_adam_bit_for_bit_with_torch_sqrt(adamw, monkeypatch):
    """With torch's own (not correctly rounded) CPU sqrt substituted, every other operation of
    the twin is torch's, rounding for rounding: bitwise equal over 12 steps."""
    monkeypatch.setattr(adamw_ref, "sqrt32", lambda x: x.sqrt())
    n = 6000
    p0 = torch.randn(n) * 3
    grads = _grads(n, 12, seed=1)
    for a, b in zip(_twin_run(p0, grads, adamw, 0.1), _torch_run(p0, grads, adamw, 0.1)):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# (b) bf16 params, "nearest": fp32 math, then one rounding


@pytest.mark.parametrize("sdt", [F32, BF16])
def test_nearest_bf16_is_fp32_math_then_round(sdt):
    """Each step equals the fp32-param step on float(param) followed by a round-to-nearest-even
    store (states in their dtype), for 5 steps."""
    n = 5000
    p, _, m, v, _ = _tensors(n, BF16, sdt)
    rp, rm, rv = p.clone(), m.clone(), v.clone()
    for step, g in enumerate(_grads(n, 5, seed=2), 1):
        adamw_step_ref(p, g, m, v, step=step, **KW)
        p32, m32, v32 = rp.float(), rm.float(), rv.float()
        adamw_step_ref(p32, g, m32, v32, step=step, **KW)
        rp, rm, rv = p32.to(BF16), m32.to(sdt), v32.to(sdt)
        _same(p, rp)
        _same(m, rm)
        _same(v, rv)


@pytest.mark.skipif(not TORCH_CPU_FMA, reason="needs torch's FMA CPU kernels")
def test_nearest_bf16_is_torch_adamw_then_round(monkeypatch):
    """Independently of the twin's fp32 path: torch.optim.AdamW on an fp32 copy of the bf16
    param (fp32 states), rounded to bf16 after every step (torch's sqrt substituted)."""
    monkeypatch.setattr(adamw_ref, "sqrt32", lambda x: x.sqrt())
    n = 5000
    p = (torch.randn(n) * 2).to(BF16)
    m, v = torch.zeros(n), torch.zeros(n)
    ref = p.float().requires_grad_(True)
    opt = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                            foreach=False)
    for step, g in enumerate(_grads(n, 5, seed=3), 1):
        adamw_step_ref(p, g, m, v, step=step, **KW)
        ref.grad = g
        opt.step()
        with torch.no_grad():
            ref.copy_(ref.to(BF16).float())
        _same(p, ref.detach().to(BF16))
        _same(m, opt.state[ref]["exp_avg"])


# ---------------------------------------------------------------------------------------------
# (c) kahan: updates below half a bf16 ulp


def test_kahan_tracks_fp32_where_nearest_stalls():
    """Params in [1, 2) (bf16 ulp 2**-7, half ulp 0.0039), lr 1e-3: Adam moves each param by
    ~1e-3 per step, below half an ulp, for 300 steps (0.29-0.30 in all). "nearest" never moves;
    kahan's param + compensation stays within 1e-3 of the fp32 run (measured 2e-4) and its param
    within one bf16 ulp of it."""
    gen = torch.Generator().manual_seed(0)
    n = 1000
    p0 = (1 + torch.rand(n, generator=gen)).to(BF16)
    ref, mr, vr = p0.float(), torch.zeros(n), torch.zeros(n)
    pn, mn, vn = p0.clone(), torch.zeros(n), torch.zeros(n)
    pk, ck, mk, vk = p0.clone(), torch.zeros(n, dtype=BF16), torch.zeros(n), torch.zeros(n)
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    for step in range(1, 301):
        g = 1 + 0.1 * torch.randn(n, generator=gen)
        adamw_step_ref(ref, g, mr, vr, step=step, **kw)
        adamw_step_ref(pn, g, mn, vn, step=step, **kw)
        adamw_step_ref(pk, g, mk, vk, ck, step=step, rounding="kahan", **kw)
    moved = (p0.float() - ref).abs()
    assert float(moved.min()) > 0.29
    assert torch.equal(pn, p0)  # nearest: stalled
    assert float((pn.float() - ref).abs().min()) > 0.29
    assert float((pk.float() + ck.float() - ref).abs().max()) < 1e-3
    assert float((pk.float() - ref).abs().max()) <= 2 ** -7
    assert float(ck.float().abs().max()) <= 2 ** -8  # at most half an ulp of a param in [1, 2)


# ---------------------------------------------------------------------------------------------
# (d) stochastic rounding


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_stochastic_is_unbiased(sign):
    """4096 equal params x 16 seeds: each result is one of the two bf16 neighbours of the fp32
    value, and their mean is the fp32 value (|bias| < 0.01 ulp; the sampling error is ~0.002
    ulp) while round-to-nearest is 0.3 ulp off."""
    n, ulp = 4096, 2 ** -7
    kw = dict(KW, lr=0.3 * ulp, weight_decay=0.0)
    p0 = torch.full((n,), 1.5 * sign, dtype=BF16)
    g = torch.full((n,), sign)
    p32 = p0.float()
    adamw_step_ref(p32, g, torch.zeros(n), torch.zeros(n), step=1, **kw)
    exact = float(p32[0])
    assert abs(abs(exact) - (1.5 - 0.3 * ulp)) < 1e-6
    samples = []
    for seed in range(16):
        p = p0.clone()
        adamw_step_ref(p, g, torch.zeros(n), torch.zeros(n), step=1, rounding="stochastic",
                       seed=seed, **kw)
        samples.append(p.float())
    s = torch.cat(samples)
    lo, hi = sorted([1.5 * sign, (1.5 - ulp) * sign])
    assert bool(((s == lo) | (s == hi)).all())
    assert abs(float(s.double().mean()) - exact) < 0.01 * ulp
    pn = p0.clone()
    adamw_step_ref(pn, g, torch.zeros(n), torch.zeros(n), step=1, **kw)
    assert abs(float(pn[0]) - exact) > 0.29 * ulp


def _py_hash16(i, seed):
    """The hash, spelled out in Python ints (uint32 arithmetic)."""
    x = (i * 0x9E3779B1 + seed * 0x85EBCA77) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    x ^= x >> 16
    return x >> 16


def test_hash_definition_and_spread():
    idx = torch.tensor([0, 1, 2, 65535, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32 + 5])
    for seed in (0, 1, 12345, 2 ** 32 - 1, 2 ** 40 + 3, -7):
        assert hash16(idx, seed).tolist() == [_py_hash16(int(i), seed) for i in idx]
    n = 1 << 16
    r0, r1 = hash16(torch.arange(n), 0), hash16(torch.arange(n), 1)
    for r in (r0, r1):
        assert int(r.min()) >= 0 and int(r.max()) < 65536
        assert abs(float(r.double().mean()) / 65536 - 0.5) < 0.005
        assert r.unique().numel() > 0.6 * n  # ~63% distinct for uniform 16-bit draws
    assert float((r0 == r1).double().mean()) < 1e-3  # another seed: other draws
    assert float((r0[1:] == r0[:-1]).double().mean()) < 1e-3  # neighbours differ


# ---------------------------------------------------------------------------------------------
# the twin's building blocks against exact arithmetic


def _round_f32(x: Fraction) -> float:
    """Correct round-to-nearest-even of a rational to fp32 (finite results)."""
    c = np.float32(float(x))
    cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]

    def key(y):
        return (abs(Fraction(float(y)) - x), int(np.array(y).view(np.int32)) & 1)

    return float(min(cands, key=key))


def test_fma32_is_correctly_rounded():
    # double rounding traps: a*b + c lands exactly on an fp32 midpoint in fp64 but is not one
    e23 = 2.0 ** -23
    a = [-2 * (1 + e23), 2 * (1 + e23), (1 + 2 ** -12), 1 + 2 ** -12, 3.0]
    b = [1 - e23, 1 - e23, 1 + 2 ** -12, 1 + 2 ** -12, 1e-30]
    c = [2.0 ** 25 + 4, -(2.0 ** 25 + 4), 2.0 ** -80, -(2.0 ** -80), 0.0]
    gen = torch.Generator().manual_seed(0)
    k = 4000
    rnd = [torch.randn(k, generator=gen) * torch.logspace(-20, 20, k).roll(i * 997)
           for i in range(3)]
    tiny = [torch.randn(k, generator=gen) * 2.0 ** -70, torch.randn(k, generator=gen) * 2.0 ** -70,
            torch.randn(k, generator=gen) * 2.0 ** -128]  # results in the fp32 subnormal range
    A = torch.cat([torch.tensor(a), rnd[0], tiny[0]])
    B = torch.cat([torch.tensor(b), rnd[1], tiny[1]])
    C = torch.cat([torch.tensor(c), rnd[2], tiny[2]])
    got = fma32(A, B, C)
    want = [_round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
            for x, y, z in zip(A.tolist(), B.tolist(), C.tolist())]
    assert got.tolist() == want
    assert float(got[0]) == 2.0 ** 25 + 4 and float(got[1]) == -(2.0 ** 25 + 4)
    # a Python-float multiplier (how the twin passes w1, wd)
    assert fma32(0.1000000014901161, B, C).tolist() == [
        _round_f32(Fraction(0.1000000014901161) * Fraction(float(y)) + Fraction(float(z)))
        for y, z in zip(B.tolist(), C.tolist())]


def test_sqrt32_is_correctly_rounded():
    x = torch.cat([torch.arange(0, 1 << 20, 7, dtype=torch.int32).view(torch.float32),
                   torch.rand(1 << 18) * torch.logspace(-38, 38, 1 << 18)])
    assert torch.equal(sqrt32(x), torch.from_numpy(np.sqrt(x.numpy())))


# ---------------------------------------------------------------------------------------------
# (e) kernel vs twin, bit for bit

CASES = [  # (param, exp_avg, exp_avg_sq, grad, rounding)
    (BF16, BF16, BF16, BF16, "nearest"),
    (BF16, F32, F32, F32, "nearest"),
    (BF16, BF16, F32, BF16, "kahan"),
    (BF16, F32, BF16, F32, "kahan"),
    (BF16, BF16, BF16, F32, "stochastic"),
    (BF16, F32, F32, torch.float16, "stochastic"),
    (F32, F32, F32, F32, "nearest"),
    (F32, BF16, BF16, BF16, "nearest"),
]


def _kernel_vs_twin(ts, steps=2, **kw):
    twin = _clone(ts)
    dev = _clone(ts, DEV)
    n = ts[0].numel()
    for step in range(1, steps + 1):
        adamw_step_ref(*twin, step=step, seed=step, **kw)
        _at.adamw_step_triton(*dev, step=step, seed=step, **kw)
        for t in (twin, dev):  # a new gradient for the next step
            t[1].copy_(torch.randn(n, generator=torch.Generator().manual_seed(step)))
    for a, b in zip(twin, dev):
        if a is not None:
            _same(a, b.cpu())


@needs_triton
@pytest.mark.parametrize("pdt,mdt,vdt,gdt,rounding", CASES)
@pytest.mark.parametrize("adamw", [True, False])
def test_kernel_matches_twin(pdt, mdt, vdt, gdt, rounding, adamw):
    tile = _at._TILE
    for n in (0, 1, 17, tile + 3):
        p, g, m, v, c = _tensors(n, pdt, F32, gdt, kahan=rounding == "kahan", seed=n,
                                 special=True)
        _kernel_vs_twin([p, g, m.to(mdt), v.to(vdt), c], adamw=adamw, rounding=rounding, **KW)


@needs_triton
@pytest.mark.parametrize("beta1,wd", [(0.3, 0.0), (0.0, 0.05)])
def test_kernel_matches_twin_other_branches(beta1, wd):
    """1 - beta1 >= 0.5 takes torch's other lerp branch; no weight decay skips it entirely."""
    kw = dict(KW, beta1=beta1, weight_decay=wd)
    for rounding in ("nearest", "kahan", "stochastic"):
        p, g, m, v, c = _tensors(3001, BF16, BF16, F32, kahan=rounding == "kahan", seed=7,
                                 special=True)
        for adamw in (True, False):
            _kernel_vs_twin([p, g, m, v, c], adamw=adamw, rounding=rounding, **kw)


@needs_triton
def test_kernel_many_steps_kahan_and_stochastic():
    """Ten steps with tiny updates, where the compensation and the random bits matter."""
    for rounding in ("kahan", "stochastic"):
        p, g, m, v, c = _tensors(5000, BF16, F32, F32, kahan=rounding == "kahan", seed=11)
        _kernel_vs_twin([p, g, m, v, c], steps=10, rounding=rounding,
                        **dict(KW, lr=1e-4))


def test_dispatch(monkeypatch):
    monkeypatch.delenv("ZEROLITE_FORCE_TRITON", raising=False)
    ts = _tensors(3000, BF16, F32, F32, kahan=True)
    a, b = _clone(ts), _clone(ts)
    assert not dispatch.use_triton(a[0])
    dispatch.adamw_step(*a, step=1, rounding="kahan", **KW)
    adamw_step_ref(*b, step=1, rounding="kahan", **KW)
    for x, y in zip(a, b):
        _same(x, y)
    if HAS_TRITON:
        d = _clone(ts, DEV)
        if INTERPRET:
            monkeypatch.setenv("ZEROLITE_FORCE_TRITON", "1")
        assert dispatch.use_triton(d[0])
        dispatch.adamw_step(*d, step=1, rounding="kahan", **KW)
        for x, y in zip(d, b):
            _same(x.cpu(), y)


# ---------------------------------------------------------------------------------------------
# (f) argument errors


def _bad_calls():
    p, g, m, v, c = _tensors(64, BF16, F32, F32, kahan=True)
    p32 = p.float()
    ok = dict(step=1, **KW)
    return [
        ((p32, g, m, v, None), dict(ok, rounding="kahan"), "compensation"),
        ((p32, g, m, v, None), dict(ok, rounding="stochastic"), "fp32 params"),
        ((p, g, m, v, None), dict(ok, rounding="kahan"), "needs a compensation"),
        ((p, g, m, v, c), dict(ok, rounding="nearest"), "only used with rounding='kahan'"),
        ((p, g, m, v, None), dict(ok, rounding="round"), "rounding must be one of"),
        ((p, g[:-1], m, v, None), ok, "grad has 63 elements"),
        ((p, g, m[:32], v, None), ok, "exp_avg has 32 elements"),
        ((p, g, m, v, c[:10]), dict(ok, rounding="kahan"), "compensation has 10"),
        ((p[::2], g[::2], m[::2], v[::2], None), ok, "param must be contiguous"),
        ((p, g.view(8, 8).t(), m, v, None), ok, "grad must be contiguous"),
        ((p.half(), g, m, v, None), ok, "param must be bf16 or fp32"),
        ((p, g, m.double(), v, None), ok, "exp_avg must be bf16 or fp32"),
        ((p, g.int(), m, v, None), ok, "grad must be a floating dtype"),
        ((p, g, m, v, c.float()), dict(ok, rounding="kahan"), "compensation must be bf16"),
        ((p, g, m, v, None), dict(ok, step=0), "step is the count"),
        ((p, g, m, v, None), dict(ok, beta2=1.0), "beta2 must be in"),
        ((p, g, m, v.to("meta"), None), ok, "exp_avg_sq is on meta"),
    ]


@pytest.mark.parametrize("case", range(17))
def test_argument_errors(case):
    args, kw, match = _bad_calls()[case]
    before = [None if t is None or t.is_meta else t.clone() for t in args]
    with pytest.raises(ValueError, match=match):
        adamw_step_ref(*args, **kw)
    with pytest.raises(ValueError, match=match):
        dispatch.adamw_step(*args, **kw)
    if HAS_TRITON:
        with pytest.raises(ValueError, match=match):
            _at.adamw_step_triton(*args, **kw)
    for x, y in zip(before, args):
        assert x is None or torch.equal(x, y)  # nothing written before the error


def test_empty_tensors_are_a_no_op():
    e = torch.empty(0, dtype=BF16)
    adamw_step_ref(e, e, e, e, e, step=1, rounding="kahan", **KW)
    dispatch.adamw_step(e, e.float(), e, e, step=3, rounding="stochastic", **KW)


def test_first_step_equals_sign_times_lr():
    """Step 1 from zero states: m_hat / sqrt(v_hat) = sign(g), so the update is lr * sign(g)
    (up to eps); a sanity anchor independent of torch.optim."""
    p = torch.zeros(4)
    g = torch.tensor([2.0, -3.0, 0.5, -1e-3])
    adamw_step_ref(p, g, torch.zeros(4), torch.zeros(4), step=1, **dict(KW, weight_decay=0.0))
    assert torch.allclose(p, -1e-2 * torch.sign(g), rtol=1e-5, atol=0)
    assert math.isclose(float(p[3]), 1e-2 * (1e-3 / (1e-3 + 1e-8)), rel_tol=1e-6)


def test_bandwidth_bytes_per_element():
    """benchmarks/kernel_bandwidth.py's traffic for the Adam rows: bf16 param, grad, exp_avg,
    exp_avg_sq read (8 B) and param + states written (6 B); kahan's compensation +4 B."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "kernel_bandwidth.py")
    spec = importlib.util.spec_from_file_location("kernel_bandwidth_for_adamw", path)
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)
    assert kb.adamw_traffic_bytes(1000, "nearest") == 14_000
    assert kb.adamw_traffic_bytes(1000, "stochastic") == 14_000
    assert kb.adamw_traffic_bytes(1000, "kahan") == 18_000
    assert kb.adamw_traffic_bytes(10, "nearest", param=4, grad=4, state=4) == 10 * 28
    with pytest.raises(ValueError):
        kb.adamw_traffic_bytes(1, "round")
