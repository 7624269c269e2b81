"""offload_optimizer nvme with 16-bit training: the fp32 masters live in the swap files too.

Every run uses gradient accumulation (2 micro-steps) and active clipping (gpt_cases.CLIP);
the comparison is bit for bit against the same run without offload.
"""
import os

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import RankFailed, run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.flat_placement import MasterHome
from zerolite.zero.sharded_model import gather_full_state_dict

from offload_cases import assert_same_run, train_then_die_mid_step
from gpt_cases import batches, ds_config, tiny_gpt

STEPS, HALF, SUB = 6, 3, 1000


def _cfg(world, path=None, precision="bf16", stage=3, **extra):
    cfg = ds_config(world, stage=stage, bf16=precision == "bf16", **extra)
    if precision == "fp16":  # dynamic loss scaling from 2**20: the first 3 of 6 steps overflow
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 20}
    if path is not None:
        cfg["zero_optimization"].update(
            offload_optimizer={"device": "nvme", "nvme_path": str(path)}, sub_group_size=SUB)
    return cfg


def _engine(cfg):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _masters_out_of_ram(engine) -> bool:
    """Every optimized flat's master holds one element of storage and no value in RAM."""
    flats = [f for f in engine.sharded.flats if f.master is not None]
    return bool(flats) and all(f.placement.master_home is MasterHome.FILE
                               and f.master.untyped_storage().nbytes() == 4
                               and f.master.numel() == f.shard.numel() for f in flats)


def _train(rank, world, cfg, steps=STEPS):
    engine = _engine(cfg)
    swapped = _masters_out_of_ram(engine)
    losses = train_engine(engine, batches(steps), rank, world)
    stats = engine.optimizer.offload_stats() if hasattr(engine.optimizer, "offload_stats") else None
    return (losses, gather_full_state_dict(engine.sharded), stats, engine.memory_stats(),
            engine.skipped_steps, swapped and _masters_out_of_ram(engine),
            {n: p.detach().clone() for n, p in _shards(engine)})


def _shards(engine):
    return [(str(i), f.shard) for i, f in enumerate(engine.sharded.flats)]




@pytest.mark.parametrize("world", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_swapped_masters_bitwise_equal_to_no_offload(tmp_path, world, precision):
    plain = run_ranks(_train, world, _cfg(world, precision=precision))[0]
    off = run_ranks(_train, world, _cfg(world, tmp_path, precision=precision))[0]
    assert_same_run(off, plain)  # fp32 masters (read back from the files) and losses
    for k, v in plain[6].items():  # the 16-bit param shards the step wrote chunk by chunk
        assert torch.equal(off[6][k], v), k
    assert off[5], "masters were not swapped out (or came back into RAM)"
    assert off[4] == plain[4] and (0 < off[4] < STEPS) == (precision == "fp16")
    stats, mem = off[2], off[3]
    assert mem["master_shards"] == 0 < plain[3]["master_shards"]
    # Each applied step reads (from the second) and writes master + 2 moments per chunk;
    # the masters' initial values are written once at start-up. Skipped steps move nothing.
    applied = STEPS - off[4]
    shard_bytes = plain[3]["master_shards"]  # fp32 master bytes of this rank
    assert stats["disk_bytes"] == 2 * 3 * shard_bytes
    assert stats["bytes_written"] == shard_bytes + applied * 3 * shard_bytes
    assert stats["bytes_read"] == applied * shard_bytes + (applied - 1) * 2 * shard_bytes


# -- checkpoints across modes --------------------------------------------------------------
def _save_half(rank, world, cfg, save_dir):
    engine = _engine(cfg)
    losses = train_engine(engine, batches(STEPS)[:HALF], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    return losses


def _resume(rank, world, cfg, load_dir, save_dir=None):
    engine = _engine(cfg)
    engine.load_checkpoint(load_dir, tag="half")
    swapped = _masters_out_of_ram(engine)
    if save_dir is not None:  # save again straight after the load (no step in between)
        engine.save_checkpoint(save_dir, tag="half")
    losses = train_engine(engine, batches(STEPS)[HALF:], rank, world)
    return losses, gather_full_state_dict(engine.sharded), swapped


def test_checkpoint_offload_to_plain_and_back_is_exact(tmp_path):
    world = 2
    straight = run_ranks(_train, world, _cfg(world))[0]
    off_cfg = _cfg(world, tmp_path / "swap")
    first = run_ranks(_save_half, world, off_cfg, str(tmp_path / "a"))[0]
    # offload -> no offload (which re-saves at once) -> offload again, at another chunk size.
    plain = run_ranks(_resume, world, _cfg(world), str(tmp_path / "a"), str(tmp_path / "b"))[0]
    assert_same_run((first + plain[0], plain[1]), straight)
    # Another chunk size, still a multiple of 8: the fused host Adam steps each chunk's last
    # size % 8 elements on a separate path, so other sizes round differently (optim/builder.py).
    off_cfg["zero_optimization"]["sub_group_size"] = 696
    again = run_ranks(_resume, world, off_cfg, str(tmp_path / "b"))[0]
    assert_same_run((first + again[0], again[1]), straight)
    assert again[2] and not plain[2]


# -- crash safety --------------------------------------------------------------------------
def _killed_mid_step(rank, world, cfg, save_dir, kill_at_write):
    train_then_die_mid_step(_engine(cfg), rank, world, save_dir, STEPS, HALF, kill_at_write)


def test_kill_mid_step_then_restart_from_checkpoint(tmp_path):
    world, swap = 2, tmp_path / "swap"
    cfg = _cfg(world, swap)
    straight = run_ranks(_train, world, _cfg(world))[0]
    with pytest.raises(RankFailed, match=r"rank \d"):
        # ~19 chunks x (2 moments + master) per step: write 80 is inside the second step.
        run_ranks(_killed_mid_step, world, cfg, str(tmp_path / "ckpt"), 80)
    assert len(os.listdir(swap)) == 2  # the dead run's swap dirs stay; a restart makes new ones
    losses, params, swapped = run_ranks(_resume, world, cfg, str(tmp_path / "ckpt"))[0]
    assert_same_run((straight[0][:HALF] + losses, params), straight)
    assert swapped


# -- everything else that reads or writes a master -----------------------------------------
def _modify_and_export(rank, world, cfg, out_dir):
    engine = _engine(cfg)
    train_engine(engine, batches(STEPS)[:2], rank, world)
    weight = engine.module.blocks[0].fc.weight
    with zerolite.zero.GatheredParameters([weight], modifier_rank=0):
        if rank == 0:
            weight.data.mul_(0.5).add_(0.25)
    losses = train_engine(engine, batches(STEPS)[2:4], rank, world)
    engine.save_16bit_model(out_dir, "model.safetensors")
    return losses, gather_full_state_dict(engine.sharded), None, _masters_out_of_ram(engine)


def test_gathered_parameters_write_and_16bit_save_see_swapped_masters(tmp_path):
    from safetensors.torch import load_file

    world = 2
    plain_cfg, off_cfg = _cfg(world), _cfg(world, tmp_path / "swap")
    for cfg in (plain_cfg, off_cfg):
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    plain = run_ranks(_modify_and_export, world, plain_cfg, str(tmp_path / "p"))[0]
    off = run_ranks(_modify_and_export, world, off_cfg, str(tmp_path / "o"))[0]
    assert_same_run(off[:2], plain[:2])
    assert off[3] and not plain[3]
    a, b = load_file(tmp_path / "p" / "model.safetensors"), load_file(tmp_path / "o" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
