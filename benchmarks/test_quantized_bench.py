"""Compressed communication: bytes on the wire per step vs fp32, and CPU throughput of the
torch-twin quantize / dequantize kernels.

    .venv/bin/python -m pytest benchmarks/test_quantized_bench.py -s

Bytes: the tiny test GPT at world size 2 (ZeRO-3, gradient accumulation 2), counted by the
reducer (gradients) and the gatherer (parameters) over the timed steps, divided by steps.
Throughput: a 16M-element fp32 tensor, one thread (benchmarks/conftest.py), GB/s of fp32
input read (quantize) or fp32 output written (dequantize).
"""
import sys
from pathlib import Path

import pytest
import torch

import zerolite
from triton_kernels import dequantize, dequantize_sum, quantize
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gpt_cases import batches, ds_config, tiny_gpt  # noqa: E402

WORLD, STEPS = 2, 4
NUMEL, BLOCK = 16 * 1024 * 1024, 256
VARIANTS = {
    "fp32": ({}, None, None),
    "bf16": ({}, None, "bf16"),
    "int8": ({"zero_quantized_gradients": True}, {"quantized_gradients_bits": 8}, None),
    "int4": ({"zero_quantized_gradients": True}, {"quantized_gradients_bits": 4}, None),
    "int8_weights": ({"zero_quantized_weights": True}, None, None),
}
_bytes: dict = {}


def _steps(rank, world, variant):
    zero_extra, extras, comm = VARIANTS[variant]
    cfg = ds_config(world)
    cfg["zero_optimization"] = {**cfg["zero_optimization"], **zero_extra}
    if extras:
        cfg["zerolite"] = extras
    if comm:
        cfg["communication_data_type"] = comm
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    train_engine(engine, batches(STEPS), rank, world)
    return (sum(engine.sharded.reducer.bytes_sent.values()) / STEPS,
            sum(engine.sharded.gatherer.bytes_sent.values()) / STEPS)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bytes_per_step(benchmark, variant):
    grad_b, gather_b = benchmark.pedantic(lambda: run_ranks(_steps, WORLD, variant)[0],
                                          rounds=1, iterations=1)
    _bytes[variant] = (grad_b, gather_b)
    info = {"variant": variant, "world_size": WORLD, "grad_bytes_per_step": grad_b,
            "gather_bytes_per_step": gather_b}
    if "fp32" in _bytes:
        info["grad_ratio_vs_fp32"] = grad_b / _bytes["fp32"][0]
        info["gather_ratio_vs_fp32"] = gather_b / _bytes["fp32"][1]
    benchmark.extra_info.update(info)
    print(f"\n{variant}: grads {grad_b / 1e6:.3f} MB/step/rank "
          f"({info.get('grad_ratio_vs_fp32', 1.0):.4f}x), gathers {gather_b / 1e6:.3f} MB/step/rank "
          f"({info.get('gather_ratio_vs_fp32', 1.0):.4f}x)")


@pytest.fixture(scope="module")
def big():
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(0))


def _report(benchmark, what, bits, nbytes):
    gbs = nbytes / benchmark.stats.stats.median / 1e9
    benchmark.extra_info.update({"op": what, "bits": bits, "numel": NUMEL, "block_size": BLOCK,
                                 "GB_per_s": gbs, "threads": torch.get_num_threads()})
    print(f"\n{what} int{bits}: {gbs:.2f} GB/s (fp32 side, {torch.get_num_threads()} thread)")


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_throughput(benchmark, big, bits):
    benchmark.pedantic(quantize, args=(big, bits, BLOCK), rounds=3, iterations=1, warmup_rounds=1)
    _report(benchmark, "quantize", bits, big.numel() * 4)


@pytest.mark.parametrize("bits", [8, 4])
def test_dequantize_throughput(benchmark, big, bits):
    codes, scales = quantize(big, bits, BLOCK)
    benchmark.pedantic(dequantize, args=(codes, scales, bits, BLOCK, NUMEL), rounds=3,
                       iterations=1, warmup_rounds=1)
    _report(benchmark, "dequantize", bits, NUMEL * 4)


@pytest.mark.parametrize("bits", [8])
def test_dequantize_sum_throughput(benchmark, big, bits):
    """The qgZ receive side: 2 chunks of 8M dequantized and summed (world size 2)."""
    half = NUMEL // 2
    codes, scales = quantize(big, bits, BLOCK)
    benchmark.pedantic(dequantize_sum, args=(codes.view(2, -1), scales.view(2, -1), bits, BLOCK,
                                             half), rounds=3, iterations=1, warmup_rounds=1)
    _report(benchmark, "dequantize_sum", bits, NUMEL * 4)
