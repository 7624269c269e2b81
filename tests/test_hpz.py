"""ZeRO++ hpZ (`zero_optimization.zero_hpz_partition_size`): 4 ranks as 2 loopback nodes of 2
(LOCAL_WORLD_SIZE=2, as torchrun sets it on each of two nodes), hpz 2.

Parity with single-process PyTorch (fp32, gas 2, prefetch on; with activation checkpointing
too), the bytes sent to the other node measured at the collectives with and without hpZ,
checkpoints, refusals, qwZ/qgZ, GatheredParameters, memory, and one job of two real
`zerolite --num_nodes 2` launchers."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import zerolite
from zerolite.comm import collectives
from zerolite.comm.topology import NodeLayout, check_hpz
from zerolite.config import load_config
from zerolite.errors import ZeroliteConfigError
from zerolite.testing.multiprocess import RankFailed, run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine, train_reference
from zerolite.zero.gathered import GatheredParameters
from zerolite.zero.sharded_model import gather_full_state_dict

from exit_cases import free_port
from gpt_cases import CLIP, TINY, adamw, batches, ds_config, reference_run, tiny_gpt
from test_activation_checkpointing import CheckpointedGPT, TorchCheckpointedGPT

WORLD, PER_NODE, HPZ = 4, 2, 2
STEPS = 6
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(hpz=HPZ, **zero):
    cfg = ds_config(WORLD)  # fp32, gas 2, stage 3, prefetch on, nothing persistent
    cfg["zero_optimization"].update(zero_hpz_partition_size=hpz, **zero)
    return cfg


def _train(rank, world, model_fn, hpz, steps=STEPS, zero=None):
    engine, *_ = zerolite.initialize(model=model_fn(), config=_config(hpz, **(zero or {})))
    losses = train_engine(engine, batches(steps), rank, world)
    return (losses, gather_full_state_dict(engine.sharded), engine.last_step_stats,
            engine.memory_stats()["secondary_shards"])


def _on_nodes(fn, *args, **kwargs):
    return run_ranks(fn, WORLD, *args, ranks_per_node=PER_NODE, **kwargs)


def _checkpointed():
    torch.manual_seed(0)
    return CheckpointedGPT(TINY)


def _torch_checkpointed():
    torch.manual_seed(0)
    return TorchCheckpointedGPT(TINY)


def _max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# -- (1) parity ------------------------------------------------------------------------------
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_matches_single_process_reference(checkpointed):
    """Per-step losses within 1e-5 (relative) and parameters within 1e-5 of plain PyTorch
    over 6 steps of 2 micro-steps; the backward gathers come from the secondary shards (the
    recompute's too, under activation checkpointing) and nothing is held after a step."""
    if checkpointed:
        ref_losses, ref_params = train_reference(_torch_checkpointed(), batches(STEPS), adamw,
                                                 clip=CLIP)
    else:
        ref_losses, ref_params = reference_run(STEPS)
    model_fn = _checkpointed if checkpointed else tiny_gpt
    losses, params, stats, held = _on_nodes(_train, model_fn, HPZ)[0]
    print(f"hpz parity ({'checkpointed' if checkpointed else 'plain'}): max rel loss diff "
          f"{_max_rel(losses, ref_losses):.2e}, max param diff "
          f"{max((params[k] - v).abs().max().item() for k, v in ref_params.items()):.2e}")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-5, msg=name)
    # Both micro-steps' backward gathers of the two blocks ran on the secondary shards, in
    # the node: a block's secondary is half of its 12,704 fp32 elements, sent to 1 rank.
    block = 12 * TINY.d_model ** 2 + 13 * TINY.d_model
    assert stats.secondary_gather_bytes == 2 * TINY.n_layer * (block // 2) * 4
    assert stats.inter_node_bytes_by_collective["secondary_all_gather"] == 0
    assert stats.peak_secondary_bytes == TINY.n_layer * (block // 2) * 4
    assert held == 0, "secondary shards held after the step"


# -- (2) bytes to the other node -------------------------------------------------------------
class Blocks(nn.Module):
    """Every parameter in a re-gathered unit (no root parameters): the backward gathers are a
    third of what a step sends in fp32."""

    def __init__(self, width=24, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x, y):
        for block in self.blocks:
            x = torch.tanh(block(x))
        return nn.functional.mse_loss(x, y)


def _blocks():
    torch.manual_seed(0)
    return Blocks()


def _float_batches(steps=2, width=24):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, width, generator=g), torch.randn(8, width, generator=g))
            for _ in range(steps)]


def _far_bytes_at_the_collectives(rank, world, hpz):
    """Bytes this rank hands the collectives for ranks of the other node in the last step,
    recorded by wrappers around the torch.distributed calls from the tensors and groups they
    get (independent of the engine's own counting), and the engine's count."""
    layout = NodeLayout(world, PER_NODE)
    seen = {"far": 0}

    def peers(group):
        return dist.get_process_group_ranks(group) if group is not None else range(world)

    def far(group):
        return sum(layout.node_of(r) != layout.node_of(rank) for r in peers(group))

    gather, to_all = collectives._all_gather_flat, dist.all_to_all_single

    def gather_spy(out, inp, group=None, async_op=False):
        seen["far"] += inp.numel() * inp.element_size() * far(group)
        return gather(out, inp, group=group, async_op=async_op)

    def to_all_spy(out, inp, *args, group=None, async_op=False):
        n = len(list(peers(group)))
        seen["far"] += inp.numel() * inp.element_size() // n * far(group)
        return to_all(out, inp, *args, group=group, async_op=async_op)

    collectives._all_gather_flat, dist.all_to_all_single = gather_spy, to_all_spy
    cfg = _config(hpz)
    engine, *_ = zerolite.initialize(model=_blocks(), config=cfg)
    data = _float_batches()
    train_engine(engine, data[:1], rank, world)
    seen["far"] = 0  # the last step only
    losses = train_engine(engine, data[1:], rank, world)
    return seen["far"], engine.last_step_stats.inter_node_bytes, losses


def test_hpz_cuts_bytes_to_the_other_node_by_a_third():
    """Per rank per step, bytes for ranks of the other node: the backward all-gather's
    share (one of three equal fp32 parts: forward gather, backward gather, gradient reduce)
    stays in the node. Measured at the collectives, equal to last_step_stats' count."""
    plain = _on_nodes(_far_bytes_at_the_collectives, 1)
    hpz = _on_nodes(_far_bytes_at_the_collectives, HPZ)
    for (spied, counted, _), (spied_h, counted_h, _) in zip(plain, hpz):
        assert (spied, spied_h) == (counted, counted_h)
        assert spied_h <= spied * 2 / 3, (spied, spied_h)
    print(f"bytes to the other node per rank per step: {plain[0][0]} without hpZ, "
          f"{hpz[0][0]} with hpZ {HPZ} ({1 - hpz[0][0] / plain[0][0]:.1%} less)")
    assert hpz[0][2] == plain[0][2]  # the same training


# -- (3) checkpoints -------------------------------------------------------------------------
def _save_then_load(rank, world, save_dir, load_hpz):
    data = batches(4)
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=_config(HPZ))
    train_engine(engine, data[:2], rank, world)
    engine.save_checkpoint(save_dir, tag="t")
    straight = train_engine(engine, data[2:], rank, world)
    other, *_ = zerolite.initialize(model=tiny_gpt(seed=5), config=_config(load_hpz))
    other.load_checkpoint(save_dir, tag="t")
    resumed = train_engine(other, data[2:], rank, world)
    names = sorted(os.listdir(os.path.join(save_dir, "t")))
    return straight, resumed, names


@pytest.mark.parametrize("load_hpz", [HPZ, 1], ids=["into_hpz", "into_hpz_off"])
def test_checkpoint_roundtrip(tmp_path, load_hpz):
    """Saved with hpZ on (after steps that held secondary shards), loaded with hpZ on or
    off: training continues bitwise as without the save (a gather from the secondary
    shards gives the same values as one from the primary ones)."""
    out = _on_nodes(_save_then_load, str(tmp_path), load_hpz)
    straight, resumed, names = out[0]
    assert resumed == straight
    assert not any("secondary" in n for n in names), names


# -- (4) refusals ----------------------------------------------------------------------------
def test_config_refusals():
    with pytest.raises(ZeroliteConfigError, match=r"zero_optimization\.zero_hpz_partition_size"
                       r".*2 needs zero_optimization\.stage 3.*stage 2"):
        load_config(ds_config(4, stage=2, zero_optimization={
            "stage": 2, "zero_hpz_partition_size": 2}), 4)
    for bad in (-1, "2", 1.5):
        with pytest.raises(ZeroliteConfigError, match="zero_hpz_partition_size"):
            load_config(_config(bad), 4)
    for hpz, layout in ((4, NodeLayout(8, 2)), (3, NodeLayout(8, 4)), (4, NodeLayout(6, 6))):
        with pytest.raises(ZeroliteConfigError, match=rf"zero_hpz_partition_size={hpz} must "
                           rf"divide the ranks per node \({layout.ranks_per_node}, "
                           rf"LOCAL_WORLD_SIZE\) and the world size \({layout.world_size}\)"):
            check_hpz(hpz, layout)
    check_hpz(2, NodeLayout(8, 4))
    check_hpz(0, NodeLayout(3, 3))  # 0 and 1: off
    with pytest.raises(ZeroliteConfigError, match="LOCAL_WORLD_SIZE=3"):
        NodeLayout(4, 3)


def _init(rank, world, hpz):
    zerolite.initialize(model=tiny_gpt(), config=_config(hpz))


def test_engine_refuses_a_group_larger_than_the_node():
    """hpz 4 on nodes of 2: every rank stops at initialize with the error, none hangs."""
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"zero_hpz_partition_size=4 must divide the ranks "
                                         r"per node \(2"):
        _on_nodes(_init, 4, timeout_s=60)
    assert time.monotonic() - start < 30


# -- (5) qwZ and qgZ -------------------------------------------------------------------------
def test_with_quantized_weights_and_gradients():
    """qwZ + qgZ + hpZ: the secondary shards are slices of the forward's dequantized
    weights, gathered exactly, so the run equals qwZ + qgZ without hpZ bit for bit (whose
    backward re-quantizes the same shards), and it tracks the fp32 reference within the
    quantization error."""
    zero = {"zero_quantized_weights": True, "zero_quantized_gradients": True}
    ref_losses, _ = reference_run(STEPS)
    with_hpz, without = (_on_nodes(_train, tiny_gpt, h, zero=zero)[0] for h in (HPZ, 1))
    assert with_hpz[0] == without[0]
    print(f"qwZ+qgZ+hpZ: max rel loss diff to fp32 reference {_max_rel(with_hpz[0], ref_losses):.2e}")
    assert _max_rel(with_hpz[0], ref_losses) < 2e-2
    stats = with_hpz[2]
    assert stats.secondary_gather_bytes > 0
    assert stats.inter_node_bytes_by_collective["secondary_all_gather"] == 0
    assert stats.inter_node_bytes < without[2].inter_node_bytes


# -- (6) bf16 master weights ------------------------------------------------------------------
def _train_bf16_masters(rank, world, hpz):
    cfg = _config(hpz)
    cfg["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True,
                   "bf16_optimizer_states": True}
    cfg["zerolite"] = {"master_rounding": "kahan"}
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    losses = train_engine(engine, batches(STEPS), rank, world)
    return losses, gather_full_state_dict(engine.sharded), engine.last_step_stats


def test_with_bf16_master_weights():
    """bf16 masters + states (a bf16 master IS the bf16 shard) with hpZ: the secondary
    shards are bf16 slices of the forward's gathered weights, so the run equals the same run
    without hpZ bit for bit, and the backward gathers move bf16 (2 bytes per element)."""
    with_hpz, without = (_on_nodes(_train_bf16_masters, h)[0] for h in (HPZ, 1))
    assert with_hpz[0] == without[0]
    for name, value in without[1].items():
        assert value.dtype == torch.bfloat16, name
        assert torch.equal(with_hpz[1][name], value), name
    block = 12 * TINY.d_model ** 2 + 13 * TINY.d_model
    assert with_hpz[2].secondary_gather_bytes == 2 * TINY.n_layer * (block // 2) * 2
    assert with_hpz[2].inter_node_bytes < without[2].inter_node_bytes


# -- GatheredParameters --------------------------------------------------------------------
def _modify_between_forward_and_backward(rank, world):
    """After the forward (the blocks hold secondary shards), rank 0 sets block 0's first
    weight row through GatheredParameters(modifier_rank=0): the block's secondary shards
    are dropped, so backward gathers the new value, not the stale secondary."""
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=_config(HPZ))
    qkv = engine.module.blocks[0].attn.qkv
    seen = {}

    def in_backward(module, grad_in, grad_out):  # the weight backward computes with
        seen["row"] = module.weight[0].detach().clone()

    qkv.register_full_backward_hook(in_backward)
    x, y = rank_micro_batches(batches(1)[0], rank, world, 2)[0]
    loss = engine(x, y)
    unit = qkv.weight.zl_handle.unit
    held_before = unit.secondary_nbytes
    with GatheredParameters([qkv.weight], modifier_rank=0):
        if rank == 0:
            qkv.weight.data[0].fill_(0.25)
    held_after = unit.secondary_nbytes
    engine.backward(loss)
    return held_before, held_after, seen["row"]


def test_gathered_parameters_write_drops_the_secondary():
    for before, after, row in _on_nodes(_modify_between_forward_and_backward):
        assert before > 0 and after == 0
        assert torch.equal(row, torch.full_like(row, 0.25))


def _writes(rank, world):
    from zerolite.zero.flat_param import FlatParam

    flat = FlatParam([(("w",), nn.Parameter(torch.arange(6.0)))], rank=rank, partitions=world,
                     compute_dtype=torch.float32, group_index=0, secondary_partitions=world,
                     secondary_rank=rank)
    dropped = {}
    for name, write in (("write_shard", lambda: flat.write_shard(0, torch.ones(1))),
                        ("copy_into_shard", lambda: flat.copy_into_shard(0, torch.ones(1))),
                        ("write_master", lambda: flat.write_master(flat.master_value())),
                        ("refresh_shard_from_master", flat.refresh_shard_from_master)):
        flat.alloc_full().copy_(torch.arange(6.0))
        flat.keep_secondary()
        kept = flat.secondary.tolist()
        flat.free_full()
        write()
        dropped[name] = (kept, flat.secondary)
    return dropped


def test_every_write_of_the_shard_drops_the_secondary():
    """The secondary is never stale: each way of writing a flat's shard or master drops it."""
    for rank, dropped in enumerate(run_ranks(_writes, 2)):
        for name, (kept, now) in dropped.items():
            assert kept == [3.0 * rank, 3.0 * rank + 1, 3.0 * rank + 2], name
            assert now is None, name


# -- memory ----------------------------------------------------------------------------------
def test_check_config_row_matches_the_measured_peak():
    """The secondary shards' bytes in check-config (`--model`) equal the engine's measured
    peak: the blocks' compute-dtype params / hpz (the root unit is never re-gathered)."""
    from zerolite.cli.check_config import summarize

    cfg = load_config(_config(HPZ), WORLD)
    model = tiny_gpt()
    mem = summarize(cfg, sum(p.numel() for p in model.parameters()), model)["memory"]
    block = 12 * TINY.d_model ** 2 + 13 * TINY.d_model
    assert mem["hpz_secondary_bytes"] == TINY.n_layer * block * 4 // HPZ
    # the measured peak of the parity run (test_matches_single_process_reference checks it)
    assert mem["hpz_secondary_bytes"] == TINY.n_layer * (block // 2) * 4


# -- two launchers ---------------------------------------------------------------------------
@pytest.mark.slow
def test_two_zerolite_launchers_on_loopback():
    """`zerolite --num_nodes 2 --node_rank r --num_procs 2` twice on 127.0.0.1: torchrun
    gives each rank LOCAL_WORLD_SIZE=2, hpZ 2 builds groups inside each launcher's node,
    training runs and every launcher exits 0."""
    port = str(free_port())
    script = os.path.join(ROOT, "tests", "compat_scripts", "hpz_train.py")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "zerolite.cli", "--num_nodes", "2", "--node_rank", str(r),
         "--num_procs", "2", "--master_addr", "127.0.0.1", "--master_port", port, script],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    text = "\n".join(outs)
    assert [p.returncode for p in procs] == [0, 0], text
    lines = re.findall(r"\[rank (\d)\] hpz ok: node (\d), secondary gather bytes (\d+), "
                       r"of them to the other node (\d+)", text)
    assert sorted((int(r), int(n)) for r, n, _, _ in lines) == [(0, 0), (1, 0), (2, 1), (3, 1)], text
    assert all(int(b) > 0 and int(far) == 0 for _, _, b, far in lines), text
