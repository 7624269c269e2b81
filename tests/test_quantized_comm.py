"""Compressed communication (ZeRO++ qgZ / qwZ) and 16-bit gradient communication.

Error bound tested for the quantized reduce-scatter (round to nearest): rank k's chunk for
element i lies in a block whose scale is s_k = absmax_block_k / qmax (qmax 127 int8, 7 int4);
its dequantized value is within s_k / 2 of the original, so the averaged shard is within
mean_k(s_k / 2) of the exact average (plus a few fp32 ulps). Stochastic rounding: < s_k per
contribution, i.e. mean_k(s_k).
"""
import pytest
import torch

import zerolite
from triton_kernels import dequantize, quantize
from triton_kernels.quantize_ref import QMAX
from zerolite.comm.build import build_grad_reducer, build_param_gatherer
from zerolite.comm.quantized import QuantizedGradReducer, QuantizedParamGatherer
from zerolite.comm.reducers import GradReducer
from zerolite.config import load_config
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine

from gpt_cases import batches, ds_config, tiny_gpt


class FakeFlat:
    """The attributes reducers and gatherers read from a FlatParam."""

    def __init__(self, rank, partitions, shard_numel, dtype=torch.float32):
        self.rank, self.partitions, self.shard_numel = rank, partitions, shard_numel
        self.padded_numel = shard_numel * partitions
        self.full = torch.empty(self.padded_numel, dtype=dtype)
        self.shard = torch.empty(shard_numel, dtype=dtype)
        self.secondary = None  # no hpZ secondary shard held
        self.comm_dtype = None  # the reducer's own dtype
        self.fetch_dtype = None  # gathers in the compute dtype
        self.keeps_reduced_grad = False  # stage 0 in 16 bit only (flat_param.py)

    def alloc_full(self):
        return self.full


def rank_grads(world, numel, seed=0):
    """Every rank's full gradient (same on every process), with block-varying magnitudes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world, numel, generator=g)
    return x * torch.logspace(-3, 1, numel).roll(numel // 3)[None] * (1 + torch.arange(world))[:, None]


def chunk_scales(chunk, bits, block):
    """Per-element scale of the block each element of a 1-D chunk falls in."""
    n = chunk.numel()
    nb = -(-n // block)
    padded = torch.nn.functional.pad(chunk.abs(), (0, nb * block - n)).view(nb, block)
    return (padded.amax(1) / QMAX[bits]).repeat_interleave(block)[:n]


def _reduce(rank, world, bits, block, stochastic, shard, seed):
    grads = rank_grads(world, shard * world, seed)
    red = QuantizedGradReducer(world, bits=bits, block_size=block, stochastic=stochastic)
    flat = FakeFlat(rank, world, shard)
    out = red.start(flat, grads[rank].clone()).wait()
    return out, dict(red.bytes_sent)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantized_reduce_scatter_error_bound(world, bits, stochastic):
    shard, block = 1000, 64  # ragged: 1000 = 15 blocks + 40
    results = run_ranks(_reduce, world, bits, block, stochastic, shard, 3)
    grads = rank_grads(world, shard * world, 3)
    for r, (out, _) in enumerate(results):
        chunks = grads[:, r * shard:(r + 1) * shard]
        exact = chunks.mean(0)
        scales = torch.stack([chunk_scales(c, bits, block) for c in chunks])
        bound = scales.mean(0) * (1.0 if stochastic else 0.5)
        err = (out - exact).abs()
        slack = 1e-6 * chunks.abs().sum(0) + 1e-30
        assert out.dtype == torch.float32 and out.shape == (shard,)
        assert bool((err <= bound + slack).all()), float((err - bound).max())
        assert float(err.max()) > 0  # it did quantize


def _nonfinite(rank, world):
    grads = rank_grads(world, 512 * world, 5)
    if rank == 1:
        grads[1, 7] = float("nan")          # lands in rank 0's shard
        grads[1, 512 + 300] = float("inf")  # lands in rank 1's shard
    red = QuantizedGradReducer(world, bits=8, block_size=64, error_feedback=True)
    flat = FakeFlat(rank, world, 512)
    out = red.start(flat, grads[rank].clone()).wait()
    res = red.residual(flat)
    # the next step is finite again and the residual did not poison it
    out2 = red.start(flat, rank_grads(world, 512 * world, 6)[rank].clone()).wait()
    return out, bool(torch.isfinite(res).all()), bool(torch.isfinite(out2).all())


def test_nonfinite_gradient_stays_nonfinite():
    results = run_ranks(_nonfinite, 2)
    (out0, res_ok0, next_ok0), (out1, res_ok1, next_ok1) = results
    assert not bool(torch.isfinite(out0[0:64]).any())      # the NaN's block
    assert not bool(torch.isfinite(out1[256:320]).any())   # the Inf's block
    assert bool(torch.isfinite(out0[64:]).all()) and bool(torch.isfinite(out1[:256]).all())
    assert res_ok0 and res_ok1 and next_ok0 and next_ok1


def _feedback(rank, world, error_feedback, steps):
    shard = 768
    flat = FakeFlat(rank, world, shard)
    red = QuantizedGradReducer(world, bits=4, block_size=256, error_feedback=error_feedback)
    total_q = torch.zeros(shard)
    total_exact = torch.zeros(shard)
    first_residual = None
    for step in range(steps):
        # a persistent component (rounded the same way each step) plus fresh noise
        grads = rank_grads(world, shard * world, 0) + 0.1 * rank_grads(world, shard * world, step + 1)
        total_exact += grads[:, rank * shard:(rank + 1) * shard].mean(0)
        total_q += red.start(flat, grads[rank].clone()).wait()
        if step == 0 and error_feedback:
            g = grads[rank]
            sent = torch.cat([dequantize(*quantize(c, 4, 256), 4, 256, shard)
                              for c in g.view(world, shard)])
            first_residual = (red.residual(flat), g - sent)
    return (total_q - total_exact).abs().max().item(), first_residual


def test_error_feedback_reduces_accumulated_error():
    steps = 12
    with_ef = run_ranks(_feedback, 2, True, steps)
    without = run_ranks(_feedback, 2, False, steps)
    for (err_ef, (stored, expected)), (err_plain, _) in zip(with_ef, without):
        assert stored is not None and stored.shape == expected.shape
        torch.testing.assert_close(stored, expected, rtol=0, atol=1e-6)
        assert err_ef < 0.25 * err_plain, (err_ef, err_plain)


def _gather(rank, world, dtype, shard):
    g = torch.Generator().manual_seed(11)
    shards = (torch.randn(world, shard, generator=g) * torch.logspace(-2, 1, shard)).to(dtype)
    flat = FakeFlat(rank, world, shard, dtype)
    flat.shard.copy_(shards[rank])
    gatherer = QuantizedParamGatherer(bits=8, block_size=64)
    work = gatherer.start(flat)
    assert hasattr(work, "is_completed")
    work.wait()
    work.wait()  # idempotent
    return flat.full.clone(), shards, dict(gatherer.bytes_sent)


@pytest.mark.parametrize("world,dtype", [(2, torch.float32), (4, torch.bfloat16)])
def test_quantized_weight_gather(world, dtype):
    shard = 700
    results = run_ranks(_gather, world, dtype, shard)
    shards = results[0][1]
    expected = torch.cat([dequantize(*quantize(s, 8, 64), 8, 64, shard, dtype) for s in shards])
    for full, _, sent in results:
        assert full.dtype == dtype
        assert torch.equal(full, expected)  # identical on every rank
        # 11 blocks of int8 codes + fp32 scales, sent to each of the other world - 1 ranks
        assert sent["all_gather"] == (11 * 64 + 11 * 4) * (world - 1)
    bound = torch.cat([chunk_scales(s.float(), 8, 64) for s in shards]) * 0.5
    err = (expected.float() - shards.reshape(-1).float()).abs()
    assert bool((err <= bound * 1.01 + 1e-2 * shards.reshape(-1).float().abs()
                 * (dtype == torch.bfloat16)).all())


def _sixteen_bit(rank, world, dtype):
    grads = rank_grads(world, 512 * world, 9)
    red = GradReducer(world, comm_dtype=dtype, scatter_method="reduce_scatter")
    out = red.start(FakeFlat(rank, world, 512), grads[rank].clone()).wait()
    return out, dict(red.bytes_sent)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_reduce_scatter_within_dtype_rounding(dtype):
    world = 4
    results = run_ranks(_sixteen_bit, world, dtype)
    grads = rank_grads(world, 512 * world, 9)
    eps = torch.finfo(dtype).eps
    for r, (out, sent) in enumerate(results):
        chunks = grads[:, r * 512:(r + 1) * 512]
        exact = chunks.mean(0)
        # one rounding per input cast, one per partial sum, one for the result
        tol = (world + 1) * eps * chunks.abs().mean(0) + 1e-6
        assert out.dtype == torch.float32
        assert bool(((out - exact).abs() <= tol).all())
        assert float((out - exact).abs().max()) > 0
        assert sent["reduce_scatter"] == 512 * (world - 1) * 2  # the other ranks' chunks


def _bytes(rank, world, bits, shard):
    red = QuantizedGradReducer(world, bits=bits, block_size=256)
    exact = GradReducer(world, scatter_method="reduce_scatter")
    flat = FakeFlat(rank, world, shard)
    g = torch.randn(world * shard)
    red.start(flat, g.clone()).wait()
    exact.start(flat, g.clone()).wait()
    return red.bytes_sent["all_to_all"] / exact.bytes_sent["reduce_scatter"]


@pytest.mark.parametrize("bits,ratio", [(8, 0.27), (4, 0.14)])
def test_wire_bytes_ratio(bits, ratio):
    formula = bits / 32 + 4 / (256 * 4)   # codes + one fp32 scale per 256 elements
    measured = run_ranks(_bytes, 2, bits, 256 * 40)[0]
    assert measured == pytest.approx(formula, rel=1e-9)
    assert measured == pytest.approx(ratio, abs=0.02)


def test_build_picks_quantized_classes():
    base = ds_config(2)
    cfg = dict(base, zero_optimization={**base["zero_optimization"],
                                        "zero_quantized_gradients": True,
                                        "zero_quantized_weights": True},
               zerolite={"quantized_gradients_bits": 4, "quantized_block_size": 128,
                         "quantized_error_feedback": True})
    config = load_config(cfg, 2)
    red = build_grad_reducer(config, 2)
    assert isinstance(red, QuantizedGradReducer)
    assert (red.bits, red.block_size, red.error_feedback) == (4, 128, True)
    assert isinstance(build_param_gatherer(config), QuantizedParamGatherer)
    plain = load_config(base, 2)
    assert type(build_grad_reducer(plain, 2)) is GradReducer
    assert not isinstance(build_param_gatherer(plain), QuantizedParamGatherer)


# -- engine: convergence and bytes per step ---------------------------------------------
STEPS = 60
VARIANTS = {
    "exact": ({}, None),
    "int8_grads": ({"zero_quantized_gradients": True}, None),
    "int4_grads_ef": ({"zero_quantized_gradients": True},
                      {"quantized_gradients_bits": 4, "quantized_error_feedback": True}),
    "int8_weights": ({"zero_quantized_weights": True}, None),
}


def _train_variants(rank, world):
    out = {}
    for name, (zero_extra, extras) in VARIANTS.items():
        cfg = ds_config(world)
        cfg["zero_optimization"] = {**cfg["zero_optimization"], **zero_extra}
        if extras:
            cfg["zerolite"] = extras
        engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
        losses = train_engine(engine, batches(STEPS), rank, world)
        out[name] = (losses, dict(engine.sharded.reducer.bytes_sent),
                     dict(engine.sharded.gatherer.bytes_sent))
    return out


@pytest.fixture(scope="module")
def trained():
    return run_ranks(_train_variants, 2, timeout_s=300)[0]


def test_quantized_training_converges(trained):
    exact = trained["exact"][0]
    assert exact[-1] < 0.75 * exact[0]  # the model learns: ~5.56 -> ~3.53
    for name in ("int8_grads", "int4_grads_ef", "int8_weights"):
        losses = trained[name][0]
        assert losses[-1] == pytest.approx(exact[-1], rel=0.02), name


def test_engine_bytes_per_step(trained):
    # exact: a reduce-scatter (NCCL) or all_to_all + local sum (gloo), same bytes
    fp32 = sum(trained["exact"][1].values())
    gather32 = trained["exact"][2]["all_gather"]
    # small flats pad each chunk to whole blocks: a little above the formula
    assert trained["int8_grads"][1]["all_to_all"] / fp32 == pytest.approx(0.254, abs=0.01)
    assert trained["int4_grads_ef"][1]["all_to_all"] / fp32 == pytest.approx(0.129, abs=0.01)
    assert trained["int8_weights"][2]["all_gather"] / gather32 == pytest.approx(0.254, abs=0.01)
    assert set(trained["int8_grads"][1]) == {"all_to_all"}


FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 4,
        "hysteresis": 1, "min_loss_scale": 1}


def _fp16_overflow(rank, world, steps, overflow_step):
    cfg = ds_config(world, fp16=FP16)
    cfg["zero_optimization"] = {**cfg["zero_optimization"], "zero_quantized_gradients": True}
    cfg["zerolite"] = {"quantized_error_feedback": True}
    engine, optimizer, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    seen, losses = [], []
    for step, batch in enumerate(batches(steps)):
        for x, y in rank_micro_batches(batch, rank, world, engine.gradient_accumulation_steps()):
            loss = engine(x, y)
            # only rank 1 overflows: its non-finite gradient must reach every rank's shard
            boost = 1e30 if (step == overflow_step and rank == 1) else 1.0
            engine.backward(loss * boost)
            engine.step()
            losses.append(loss.item())
        seen.append(optimizer.overflow)
    return seen, engine.skipped_steps, losses


def test_fp16_overflow_detected_through_quantized_reduce():
    steps, overflow_step = 6, 3
    for seen, skipped, losses in run_ranks(_fp16_overflow, 2, steps, overflow_step):
        assert seen == [i == overflow_step for i in range(steps)]
        assert skipped == 1
        assert all(torch.isfinite(torch.tensor(losses)))
