"""The step-time model (zerolite/plan.py, `zerolite plan`): byte formulas by hand, the ZeRO-3
and qwZ/qgZ byte counts against what the engine sends on gloo, ZeRO++'s published 4x, CLI."""
from __future__ import annotations

import json

import pytest
import torch

import zerolite
from zerolite.models import GPTConfig
from zerolite.plan import (Cluster, Unit, Workload, gpt_units, params_units, plan, plan_scheme,
                           quantized_nbytes, ring_split, shard_numel)
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

from gpt_cases import TINY, batches, ds_config, tiny_gpt
from test_cli import cli


def _cols(scheme, units, n, g, **w):
    r = plan_scheme(scheme, Workload(tuple(units), **w), Cluster(gpus=n, gpus_per_node=g))
    return {c.name: (c.intra_bytes, c.inter_bytes) for c in r.collectives}


# -- formulas by hand ------------------------------------------------------------------------
def test_padding_and_quantized_sizes_match_zerolite():
    from triton_kernels.dispatch import quantized_nbytes as kernel_nbytes
    from zerolite.zero.shard_math import shard_numel as engine_shard_numel

    for numel, parts in [(10, 4), (8, 4), (0, 3), (12704, 2), (13497, 2), (1, 8)]:
        assert shard_numel(numel, parts) == engine_shard_numel(numel, parts)
    for numel, bits, block in [(3, 8, 256), (256, 4, 256), (1000, 8, 128), (13497, 4, 256)]:
        assert quantized_nbytes(numel, bits, block) == kernel_nbytes(numel, bits, block)


def test_ring_split():
    assert ring_split(18, 4, 4) == (18, 0)  # one node: all NVLink
    assert ring_split(18, 4, 2) == (9, 9)  # 2 rails: half of each GPU's ring bytes leave
    assert ring_split(80, 64, 8) == (70, 10)


def test_byte_formulas_small_case():
    """One unit of 10 params on 4 GPUs, 2 per node (2 nodes), bf16: shard = ceil(10/4) = 3."""
    u = [Unit(10)]
    z3 = _cols("zero3", u, 4, 2)
    # all-gather: 3 elements x 2 B to 3 ranks = 18 B; reduce-scatter: 3 chunks of 3 x 2 B.
    assert z3 == {"all_gather fwd": (9, 9), "all_gather bwd": (9, 9),
                  "reduce_scatter grads": (9, 9)}
    # DDP: ring all-reduce of 10 x 2 B: 2 (N-1)/N = 30 B.
    assert _cols("ddp", u, 4, 2) == {"all_reduce grads": (15, 15)}
    # hpZ 2: the backward gather over the 2 GPUs of a node, of secondary shards of half the
    # flat padded for 4 ranks (12 / 2 = 6 elements, as zerolite cuts them): 6 x 2 B.
    assert _cols("zero3+hpz", u, 4, 2)["all_gather bwd (hpZ 2)"] == (12, 0)
    # qwZ int8: 3 elements -> one 256-block: 256 B codes + 4 B scale, to 3 ranks = 780 B.
    q = _cols("zero3+qwz+qgz(1hop)", u, 4, 2)
    assert q["all_gather fwd (qwZ int8)"] == (390, 390)
    # qgZ int4 one hop: 4 chunks of 3 -> 128 + 4 B each; 1 to the node, 2 to the other node.
    assert q["all_to_all grads (qgZ int4, 1 hop)"] == (132, 264)
    # qgZ two hops: intra all-to-all of 2 chunks of 6 (1 sent: 132 B), then the node's slice
    # of 6 in 2 chunks of 3 to the other node (1 sent: 132 B).
    assert _cols("zero++", u, 4, 2)["all_to_all grads (qgZ int4, 2 hops)"] == (132, 132)
    # micro-steps multiply, the root unit is not gathered again in backward, fp32 doubles.
    z3 = _cols("zero3", [Unit(10, regathered=False), Unit(8)], 4, 2, micro_steps=3,
               param_bytes=4, grad_bytes=4)
    assert z3["all_gather fwd"] == (3 * 30, 3 * 30)  # (9 + 6) elements x 4 B x 3 ranks / 2
    assert z3["all_gather bwd"] == (3 * 12, 3 * 12)  # only the 8-param unit
    assert z3["reduce_scatter grads"] == (3 * 30, 3 * 30)


def test_times_overlap_and_break_even():
    c = Cluster(gpus=16, gpus_per_node=8, intra_gbps=400, inter_gbps=50, peak_tflops=1000,
                mfu=0.5)
    w = Workload(params_units(8e9), tokens_per_gpu=1000)
    r = plan_scheme("zero3", w, c)
    assert r.compute_s == pytest.approx(6 * 8e9 * 1000 / 500e12)
    ag = r.collectives[0]  # 16 GB x 15/16 sent, 1/8 across nodes: 1.875 GB at 50 GB/s
    assert ag.inter_bytes == 15 * 1e9 // 8 and ag.seconds == pytest.approx(1.875e9 / 50e9)
    fwd, bwd = r.compute_s / 3, 2 * r.compute_s / 3
    assert r.exposed_s == pytest.approx(max(0, ag.seconds - fwd) + max(0, 2 * ag.seconds - bwd))
    assert r.step_s == pytest.approx(r.compute_s + r.exposed_s) and not r.hidden
    at = plan_scheme("zero3", Workload(w.units, tokens_per_gpu=r.break_even_tokens), c)
    assert at.hidden and at.exposed_s == 0
    below = plan_scheme("zero3", Workload(w.units, tokens_per_gpu=r.break_even_tokens - 1), c)
    assert not below.hidden


def test_refuses_bad_layouts():
    w = Workload(params_units(1000))
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        plan(w, Cluster(gpus=12, gpus_per_node=8))
    with pytest.raises(ValueError, match="hpz 3 does not divide"):
        plan(Workload(w.units, hpz=3), Cluster(gpus=16, gpus_per_node=8))


# -- against zerolite ------------------------------------------------------------------------
ODD = GPTConfig(vocab_size=257, seq_len=16, n_layer=2, n_head=3, d_model=33)
"""(257 + 16 + 2) x 33 = 9075 root and 12 x 33² + 13 x 33 = 13497 block params: both odd, so
at world 2 every flat carries one padding element."""


def _measure(rank, world, cfg_model, zero, extra, stats=False):
    cfg = ds_config(world, **extra)  # fp32, gas 2, stage 3, persistence threshold 0
    cfg["zero_optimization"].update(zero)
    engine, *_ = zerolite.initialize(model=tiny_gpt(cfg=cfg_model), config=cfg)
    for b in batches(2):
        train_engine(engine, [b], rank, world)
    s = engine.last_step_stats
    if stats:
        return s
    flats = [[f.numel for f in u.flats] for u in engine.sharded.units]
    return s.all_gather_bytes, s.reduce_bytes, flats


def _model_units(c: GPTConfig):
    return gpt_units(c.n_layer, c.d_model, c.vocab_size, c.seq_len)


@pytest.mark.parametrize("cfg_model", [TINY, ODD], ids=["tiny", "odd_padded"])
def test_zero3_bytes_equal_what_the_engine_sends(cfg_model):
    """Per rank per optimizer step at world 2, fp32, 2 micro-steps: the model's ZeRO-3 bytes
    (padding included: each unit's flat is padded to a multiple of 2) are the engine's
    `last_step_stats` counters exactly."""
    gathered, reduced, flats = run_ranks(_measure, 2, cfg_model, {}, {})[0]
    units = _model_units(cfg_model)
    assert flats == [[u.numel] for u in units]  # zerolite's units: root + one per block
    w = Workload(units, micro_steps=2, param_bytes=4, grad_bytes=4)
    r = plan_scheme("zero3", w, Cluster(gpus=2, gpus_per_node=2))
    by = {c.name: c for c in r.collectives}
    assert by["all_gather fwd"].bytes + by["all_gather bwd"].bytes == gathered
    assert by["reduce_scatter grads"].bytes == reduced
    assert r.inter_bytes == 0
    if cfg_model is ODD:  # without padding the count would be short by the pad elements
        unpadded = 2 * 4 * (sum(u.numel for u in units) / 2 + sum(u.numel for u in units[1:]) / 2)
        assert gathered - unpadded == 2 * 4 * (len(units) + len(units) - 1) / 2


def test_hpz_bytes_equal_what_the_engine_sends():
    """zero3+hpz at world 4 on 2 loopback nodes of 2 ranks, hpz 2, fp32, 2 micro-steps (odd
    sizes: padded flats): per collective, the model's bytes are the engine's exactly; the
    backward gather stays in the node in both; the forward gather and the reduce-scatter
    cross by the model's rails (1/2) and by destination in the engine (2 of 3 peers)."""
    per_rank = run_ranks(_measure, 4, ODD, {"zero_hpz_partition_size": 2}, {}, stats=True,
                         ranks_per_node=2)
    w = Workload(_model_units(ODD), micro_steps=2, param_bytes=4, grad_bytes=4, hpz=2)
    r = plan_scheme("zero3+hpz", w, Cluster(gpus=4, gpus_per_node=2))
    by = {c.name: c for c in r.collectives}
    fwd, bwd = by["all_gather fwd"], by["all_gather bwd (hpZ 2)"]
    grads = by["reduce_scatter grads"]
    for s in per_rank:  # every rank sends the same
        sent, far = s.bytes_by_collective, s.inter_node_bytes_by_collective
        assert sent == {"all_gather": fwd.bytes, "secondary_all_gather": bwd.bytes,
                        "all_to_all": grads.bytes}, sent
        assert bwd.inter_bytes == far["secondary_all_gather"] == 0
        assert (fwd.inter_bytes, grads.inter_bytes) == (fwd.bytes // 2, grads.bytes // 2)
        assert (far["all_gather"], far["all_to_all"]) == (fwd.bytes * 2 // 3, grads.bytes * 2 // 3)
        assert s.all_gather_bytes == fwd.bytes + bwd.bytes and s.reduce_bytes == grads.bytes
        assert s.secondary_gather_bytes == bwd.bytes


def test_qwz_qgz_bytes_equal_what_the_engine_sends():
    """zerolite's qwZ (int8 on every gather) and qgZ (one-hop all-to-all, int4 here)."""
    zero = {"zero_quantized_weights": True, "zero_quantized_gradients": True}
    extra = {"zerolite": {"quantized_gradients_bits": 4, "quantized_block_size": 128}}
    gathered, reduced, _ = run_ranks(_measure, 2, ODD, zero, extra)[0]
    w = Workload(_model_units(ODD), micro_steps=2, qgz_bits=4, block_size=128)
    r = plan_scheme("zero3+qwz+qgz(1hop)", w, Cluster(gpus=2, gpus_per_node=2))
    assert sum(c.bytes for c in r.collectives if c.name.startswith("all_gather")) == gathered
    assert sum(c.bytes for c in r.collectives if c.name.startswith("all_to_all")) == reduced


# -- published numbers ----------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [64, 256, 1024])
def test_zeropp_four_times_less_cross_node_traffic(gpus):
    """ZeRO++ (Wang et al. 2023): cross-node volume 3M for ZeRO-3 (M = the bf16 model) vs
    0.75M with qwZ (0.5M) + hpZ (0) + qgZ int4 (0.25M): 4x. The model, scales included."""
    c = Cluster(gpus=gpus)
    w = Workload(params_units(7e9))
    z3, zpp = plan_scheme("zero3", w, c), plan_scheme("zero++", w, c)
    assert z3.inter_bytes / zpp.inter_bytes == pytest.approx(4.0, rel=0.05)
    parts = {col.name: col.inter_bytes for col in zpp.collectives}
    base = z3.collectives[0].inter_bytes  # one bf16 all-gather's cross-node bytes
    assert parts["all_gather fwd (qwZ int8)"] / base == pytest.approx(0.5, rel=0.03)
    assert parts["all_gather bwd (hpZ 8)"] == 0
    # qgZ's node slice crosses (k-1)/k of the time, the ring's bytes (N-1)/N: 0.229 at k=8.
    assert parts["all_to_all grads (qgZ int4, 2 hops)"] / base == pytest.approx(0.25, rel=0.1)
    # zerolite's one-hop qgZ sends the chunks of every other node's ranks across: more
    # cross-node bytes than a bf16 ring reduce-scatter once there are 8 GPUs per node.
    one_hop = plan_scheme("zero3+qwz+qgz(1hop)", w, c).collectives[-1].inter_bytes
    assert one_hop > z3.collectives[-1].inter_bytes


# -- command line ---------------------------------------------------------------------------
def test_cli_table_and_json():
    r = cli("plan", "--params", "7e9", "--gpus", "8", "64", "--tokens-per-gpu", "1024")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "compute = 6 * params * tokens / (peak * MFU)" in out
    assert "64 GPUs, 8 per node (8 nodes)" in out
    for name in ("all_gather bwd (hpZ 8)", "reduce_scatter grads", "all_reduce grads",
                 "all_to_all grads (qgZ int4, 2 hops)"):
        assert name in out
    row = next(line for line in out.splitlines() if line.split()[:2] == ["64", "zero3"])
    assert row.split()[2:4] == ["36.176", "5.168"]  # 7e9 x 2 B x 63/64 x 3; 1/8 across
    r = cli("plan", "--layers", "2", "--d-model", "32", "--vocab", "256", "--seq", "16",
            "--gpus", "2", "--gpus-per-node", "2", "--dtype-bytes", "4", "--micro-steps", "2",
            "--schemes", "zero3", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    z3 = data["runs"][0]["schemes"][0]
    assert data["params"] == sum(p.numel() for p in tiny_gpt().parameters())
    assert z3["bytes"] == 238336 + 136704  # what the tiny GPT sends at world 2 (test above)


def test_cli_errors():
    from test_cli import run_main

    with pytest.raises(SystemExit) as e:
        run_main(["plan", "--layers", "2"])
    assert e.value.code == 2
    r = cli("plan", "--params", "1e9", "--gpus", "16", "--hpz", "3")
    assert r.returncode == 2 and "hpz 3 does not divide" in r.stderr
