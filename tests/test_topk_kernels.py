"""Top-k selection kernel (sparsified gradients): Triton (compiled on CUDA, interpreter
without it) vs the pure-torch twin (torch.topk on the magnitude keys). The kernel runs on DEV,
the twin on CPU; results are compared bit for bit on CPU."""

import pytest
import torch

from triton_kernels.runtime import use_interpreter_if_no_cuda

INTERPRET = use_interpreter_if_no_cuda()  # must precede any `import triton`
DEV = "cpu" if INTERPRET else "cuda"

from triton_kernels import dispatch
from triton_kernels.topk_ref import (magnitude_keys, selected_count, topk_select_ref,
                                     topk_threshold_ref)

try:
    import triton  # noqa: F401

    from triton_kernels import topk_triton as _tk
    HAS_TRITON = _tk.HAS_TRITON
except ModuleNotFoundError:
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed; "
                                  "Triton-vs-twin comparisons need it")


def _grad(n, seed=0):
    """Gradient-like values: magnitudes over 5 decades, some exact zeros and exact ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 2, n).roll(n // 3)
    x[7::113] = 0.0
    x[11::501] = 1.5  # ties, some of them at the threshold for small k
    return x


def triton_select(x, k, inplace=False):
    xd = x.to(DEV, copy=True)  # in place must not write into the caller's x
    idx, vals, res = _tk.topk_select_triton(xd, k, xd if inplace else None)
    return idx.cpu(), vals.cpu(), res.cpu()


def _same(a, b):
    for p, q in zip(a, b):
        assert p.dtype == q.dtype and p.shape == q.shape, (p.dtype, q.dtype, p.shape, q.shape)
        assert torch.equal(p, q), (p != q).nonzero()[:10]


def _check_rule(x, k, idx, vals, res):
    """The selection rule, stated independently of both implementations."""
    a = x.abs()
    kth = torch.sort(a, descending=True).values[k - 1]
    expect = ((a >= kth) & (a > 0)).nonzero().squeeze(1)
    assert torch.equal(idx.long(), expect)
    assert torch.equal(vals, x[expect])
    assert torch.equal(res[expect], torch.zeros(expect.numel()))
    keep = torch.ones(x.numel(), dtype=torch.bool)
    keep[expect] = False
    assert torch.equal(res[keep], x[keep])
    assert torch.equal(res + torch.zeros_like(x).index_put_((expect,), vals), x)


@needs_triton
@pytest.mark.parametrize("n,ratio", [(50_000, 0.01), (20_011, 0.1), (65_536, 0.001),
                                     (3000, 0.5), (1, 1.0)])
def test_select_matches_twin(n, ratio):
    x = _grad(n, seed=n)
    k = selected_count(n, ratio)
    ref = topk_select_ref(x, k)
    _same(triton_select(x, k), ref)
    _check_rule(x, k, *ref)
    assert k <= ref[0].numel() <= k + int((x.abs() == 1.5).sum())  # only ties add entries


@needs_triton
def test_threshold_is_the_kth_largest_magnitude():
    x = _grad(30_000, seed=5)
    for k in (1, 2, 299, 3000, 29_999, 30_000):
        kth = torch.topk(x.abs(), k).values[-1]
        assert topk_threshold_ref(x, k) == int(kth.view(torch.int32))
        assert _tk.topk_threshold_triton(x.to(DEV), k) == int(kth.view(torch.int32))


@needs_triton
def test_in_place_residual_and_edge_counts():
    x = _grad(12_345, seed=9)
    _same(triton_select(x, 100, inplace=True), topk_select_ref(x, 100))
    zeros = torch.zeros(5000)
    _same(triton_select(zeros, 50), topk_select_ref(zeros, 50))  # zeros are never sent
    assert topk_select_ref(zeros, 50)[0].numel() == 0
    _same(triton_select(x, 0), topk_select_ref(x, 0))
    _same(triton_select(x, 10**9), topk_select_ref(x, 10**9))  # k > numel: every non-zero


@needs_triton
def test_ties_at_threshold_are_all_taken():
    x = torch.zeros(9000)
    x[::3] = 2.0  # 3000 equal magnitudes
    x[1] = -5.0
    a = triton_select(x, 10)
    _same(a, topk_select_ref(x, 10))
    assert a[0].numel() == 3001 and float(a[2].abs().sum()) == 0.0


@needs_triton
def test_non_finite_values_are_selected_first():
    x = _grad(20_000, seed=3)
    x[[17, 9000, 15000]] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    idx, vals, res = triton_select(x, 3)
    ref = topk_select_ref(x, 3)
    assert torch.equal(idx, ref[0]) and torch.equal(idx.long(), torch.tensor([17, 9000, 15000]))
    assert torch.isnan(vals[0]) and vals[1] == float("inf") and vals[2] == float("-inf")
    assert bool(torch.isfinite(res).all()) and torch.equal(res, ref[2])


def test_twin_rule_and_keys():
    x = _grad(4096, seed=1)
    _check_rule(x, 40, *topk_select_ref(x, 40))
    keys = magnitude_keys(x)
    order = torch.argsort(x.abs(), stable=True)
    assert bool((keys[order][1:] >= keys[order][:-1]).all())  # keys sort as |x|
    with pytest.raises(TypeError):
        magnitude_keys(x.bfloat16())
    assert [selected_count(n, r) for n, r in [(1000, 0.01), (1001, 0.01), (10, 1e-6), (0, 0.5),
                                              (7, 1.0)]] == [10, 11, 1, 0, 7]


def test_dispatch(monkeypatch):
    x = _grad(3000, seed=4)
    monkeypatch.delenv("ZEROLITE_FORCE_TRITON", raising=False)
    assert not dispatch.use_triton(x)
    buf = torch.empty_like(x)
    out = dispatch.topk_select(x, 30, buf)
    _same(out, topk_select_ref(x, 30))
    assert out[2].data_ptr() == buf.data_ptr()
    if HAS_TRITON and not INTERPRET:
        _same([t.cpu() for t in dispatch.topk_select(x.to(DEV), 30)], out)
    if HAS_TRITON and INTERPRET:
        monkeypatch.setenv("ZEROLITE_FORCE_TRITON", "1")
        _same(dispatch.topk_select(x, 30), out)
