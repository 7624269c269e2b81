"""offload_param nvme (stage 3): the compute-dtype param shards live in files.

Cases: "fp32" = fp32 training with offload_optimizer nvme too (the shard IS the master and
lives only in the optimizer's master files); "bf16" = bf16 with the optimizer in memory;
"bf16+opt" = bf16 with both offloads. Every run uses gradient accumulation (2 micro-steps)
and active clipping; each is compared bit for bit with the same run without offload.
"""
import pytest
import torch

import zerolite
from zerolite.config import load_config
from zerolite.errors import ZeroliteConfigError
from zerolite.offload.plan import OffloadPlan
from zerolite.testing.multiprocess import RankFailed, run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.flat_placement import MasterHome, ShardHome
from zerolite.zero.sharded_model import gather_full_state_dict

from offload_cases import assert_same_run, train_then_die_mid_step
from gpt_cases import batches, ds_config, reference_run, tiny_gpt

STEPS, HALF, SUB = 6, 3, 1000


def _cfg(world, case=None, path=None, precision=None, **zero):
    """`case` None: no offload at the precision of `precision` (fp32 unless given)."""
    precision = precision or ("fp32" if case in (None, "fp32") else "bf16")
    cfg = ds_config(world, bf16=precision == "bf16")
    cfg["zero_optimization"].update(zero)
    if case is not None:
        cfg["zero_optimization"]["offload_param"] = {"device": "nvme",
                                                     "nvme_path": str(path / "params")}
    if case in ("fp32", "bf16+opt"):
        cfg["zero_optimization"].update(
            offload_optimizer={"device": "nvme", "nvme_path": str(path / "optim")},
            sub_group_size=SUB)
    return cfg


def _engine(cfg, freeze=False, seed=0):
    model = tiny_gpt(seed)
    if freeze:  # a frozen flat: no master, only a compute-dtype shard
        model.pos_emb.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = zerolite.initialize(model=model, model_parameters=params, config=cfg)
    return engine


def _shards_out_of_ram(engine) -> bool:
    return all(f.placement.shard.home is ShardHome.FILE and f.shard.numel() == 0
               for f in engine.sharded.flats)


def _train(rank, world, cfg, steps=STEPS):
    engine = _engine(cfg)
    out_at_start = _shards_out_of_ram(engine)
    losses = train_engine(engine, batches(steps), rank, world)
    plan = engine.placement_plan
    files = plan.param_files if isinstance(plan, OffloadPlan) else None
    swap = files.offload_stats() if files is not None else None
    return (losses, gather_full_state_dict(engine.sharded), swap, engine.memory_stats(),
            out_at_start and _shards_out_of_ram(engine))




# -- parity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", ["fp32", "bf16"])
def test_param_offload_bitwise_equal_to_no_offload(tmp_path, world, case):
    plain = run_ranks(_train, world, _cfg(world, precision=case))[0]
    off = run_ranks(_train, world, _cfg(world, case, tmp_path))[0]
    assert_same_run(off, plain)
    assert off[4], "param shards were not (or not kept) out of RAM"
    swap, mem = off[2], off[3]
    assert mem["param_shards"] == 0 < plain[3]["param_shards"]
    # One file per flat (bf16), or none (fp32: the shard is the master in the optimizer's
    # files).
    shard_bytes = plain[3]["param_shards"]
    assert swap["disk_bytes"] == (0 if case == "fp32" else shard_bytes)
    # From the second step on (the fetch order is recorded in the first) every shard a
    # gather needs was already read ahead.
    assert swap["reads"] > 0 and swap["read_ahead_hits"] == swap["reads"] - swap["reads"] // STEPS
    # Read buffers are refilled after their all-gather (at world 1 the shard is the full
    # buffer and is never reused); the parity above is what says that is safe.
    assert (swap["buffers_reused"] > 0) == (world > 1)
    if case == "fp32":
        assert mem["master_shards"] == 0 and swap["shards_from_master_files"] > 0
        ref_losses, ref_params = reference_run(STEPS)
        torch.testing.assert_close(torch.tensor(off[0]), torch.tensor(ref_losses), rtol=1e-5,
                                   atol=0)
        for name, value in ref_params.items():
            torch.testing.assert_close(off[1][name], value, rtol=1e-5, atol=1e-5)
    else:  # the step writes each new shard once (after the initial write)
        assert swap["shards_from_master_files"] == 0
        assert swap["bytes_written"] == (STEPS + 1) * shard_bytes


@pytest.mark.parametrize("persist", [0, 5000])
def test_bf16_both_offloads_and_persistent_units_bitwise_equal(tmp_path, persist):
    """Both tiers at once; with `persist` the small units stay gathered across steps."""
    world = 2
    plain = run_ranks(_train, world, _cfg(world, precision="bf16",
                                          stage3_param_persistence_threshold=persist))[0]
    off = run_ranks(_train, world, _cfg(world, "bf16+opt", tmp_path,
                                        stage3_param_persistence_threshold=persist))[0]
    assert_same_run(off, plain)
    assert off[4] and off[3]["master_shards"] == 0 == off[3]["param_shards"]


# -- checkpoints across modes ----------------------------------------------------------------
def _save_half(rank, world, cfg, save_dir, freeze):
    engine = _engine(cfg, freeze)
    losses = train_engine(engine, batches(STEPS)[:HALF], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    return losses


def _resume(rank, world, cfg, load_dir, save_dir, freeze):
    engine = _engine(cfg, freeze, seed=7)  # other initial values: all must come from the load
    engine.load_checkpoint(load_dir, tag="half")
    if save_dir is not None:  # save again straight after the load
        engine.save_checkpoint(save_dir, tag="half")
    losses = train_engine(engine, batches(STEPS)[HALF:], rank, world)
    return losses, gather_full_state_dict(engine.sharded), _shards_out_of_ram(engine)


def _straight(rank, world, cfg, freeze):
    engine = _engine(cfg, freeze)
    return train_engine(engine, batches(STEPS), rank, world), gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("case", ["fp32", "bf16"])
def test_checkpoint_param_offload_to_plain_and_back_is_exact(tmp_path, case):
    world, freeze = 2, True  # a frozen flat too: its shard is saved and loaded from its file
    plain_cfg = _cfg(world, precision=case)
    straight = run_ranks(_straight, world, plain_cfg, freeze)[0]
    first = run_ranks(_save_half, world, _cfg(world, case, tmp_path), str(tmp_path / "a"),
                      freeze)[0]
    plain = run_ranks(_resume, world, plain_cfg, str(tmp_path / "a"), str(tmp_path / "b"),
                      freeze)[0]
    assert_same_run((first + plain[0], plain[1]), straight)
    again = run_ranks(_resume, world, _cfg(world, case, tmp_path), str(tmp_path / "b"), None,
                      freeze)[0]
    assert_same_run((first + again[0], again[1]), straight)
    assert again[2] and not plain[2]


def _reload_same_engine(rank, world, cfg, save_dir):
    engine = _engine(cfg)
    train_engine(engine, batches(STEPS)[:HALF], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    train_engine(engine, batches(STEPS)[HALF:HALF + 1], rank, world)
    # Read-aheads of the next step's first shards are in flight now (old values).
    engine.load_checkpoint(save_dir, tag="half")
    losses = train_engine(engine, batches(STEPS)[HALF:], rank, world)
    return losses, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("case", ["fp32", "bf16"])
def test_load_into_a_running_engine_is_exact(tmp_path, case):
    world = 2
    straight = run_ranks(_train, world, _cfg(world, precision=case))[0]
    losses, params = run_ranks(_reload_same_engine, world, _cfg(world, case, tmp_path),
                               str(tmp_path / "ckpt"))[0]
    assert_same_run((straight[0][:HALF] + losses, params), (straight[0], straight[1]))


def _write_under_read_ahead(rank, world, cfg):
    engine = _engine(cfg)
    train_engine(engine, batches(STEPS)[:2], rank, world)
    files, units = engine.placement_plan.param_files, engine.sharded.units
    reading = files.read_ahead_flats()
    pending = [u for u in units if any(f in reading for f in u.flats)]
    unit = pending[0]
    flat = unit.flats[0]
    new = torch.arange(flat.shard_numel, dtype=flat.compute_dtype)
    if flat.placement.master_home is MasterHome.FILE and flat.compute_dtype == torch.float32:  # fp32: the shard is the master in the optimizer's files
        flat.write_master(new)  # as GatheredParameters' write-back does
    else:
        flat.write_shard(0, new)
    engine.sharded.residency.ensure_gathered(unit, None)
    seen = flat.local_shard_of(flat.full).clone()
    engine.sharded.residency.release(unit)
    return len(pending), torch.equal(seen, new)


@pytest.mark.parametrize("case", ["fp32", "bf16"])
def test_a_write_replaces_a_read_ahead_of_the_old_values(tmp_path, case):
    n_pending, fresh = run_ranks(_write_under_read_ahead, 2, _cfg(2, case, tmp_path))[0]
    assert n_pending > 0 and fresh


# -- crash safety ----------------------------------------------------------------------------
def _killed_mid_step(rank, world, cfg, save_dir, kill_at_write):
    train_then_die_mid_step(_engine(cfg), rank, world, save_dir, STEPS, HALF, kill_at_write)


def test_kill_mid_step_then_restart_from_checkpoint(tmp_path):
    world = 2
    cfg = _cfg(world, "bf16+opt", tmp_path)
    straight = run_ranks(_train, world, _cfg(world, precision="bf16"))[0]
    with pytest.raises(RankFailed, match=r"rank \d"):
        # Per step ~19 chunks x (2 moments + master) + one param write per chunk: write 100
        # is inside the second step after the save.
        run_ranks(_killed_mid_step, world, cfg, str(tmp_path / "ckpt"), 100)
    losses, params, out = run_ranks(_resume, world, cfg, str(tmp_path / "ckpt"), None,
                                    False)[0]
    assert_same_run((straight[0][:HALF] + losses, params), straight)
    assert out


# -- user-facing reads and writes of the params ----------------------------------------------
def _modify_and_export(rank, world, cfg, out_dir):
    engine = _engine(cfg, freeze=True)
    train_engine(engine, batches(STEPS)[:2], rank, world)
    weights = [engine.module.blocks[0].fc.weight, engine.module.pos_emb.weight]  # + frozen
    with zerolite.zero.GatheredParameters(weights, modifier_rank=0):
        if rank == 0:
            for w in weights:
                w.data.mul_(0.5).add_(0.25)
    losses = train_engine(engine, batches(STEPS)[2:4], rank, world)
    engine.save_16bit_model(out_dir, "model.safetensors")
    return losses, gather_full_state_dict(engine.sharded), _shards_out_of_ram(engine)


@pytest.mark.parametrize("case", ["fp32", "bf16"])
def test_gathered_parameters_write_and_16bit_save_with_param_offload(tmp_path, case):
    from safetensors.torch import load_file

    world = 2
    plain_cfg = _cfg(world, precision=case, stage3_gather_16bit_weights_on_model_save=True)
    off_cfg = _cfg(world, case, tmp_path, stage3_gather_16bit_weights_on_model_save=True)
    plain = run_ranks(_modify_and_export, world, plain_cfg, str(tmp_path / "p"))[0]
    off = run_ranks(_modify_and_export, world, off_cfg, str(tmp_path / "o"))[0]
    assert_same_run(off[:2], plain[:2])
    assert off[2] and not plain[2]
    a = load_file(tmp_path / "p" / "model.safetensors")
    b = load_file(tmp_path / "o" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- bad input ---------------------------------------------------------------------------------
def _build(rank, world, cfg):
    _engine(cfg)


def test_param_offload_refusals_name_the_key(tmp_path):
    for stage in (1, 2):
        bad = _cfg(1, "bf16", tmp_path)
        bad["zero_optimization"]["stage"] = stage
        with pytest.raises(ZeroliteConfigError,
                           match=rf"offload_param.device: 'nvme' needs .*stage 3.*stage {stage}"):
            load_config(bad, world_size=1)
    fp32_alone = _cfg(1, "bf16", tmp_path, precision="fp32")
    with pytest.raises(RankFailed, match=r"offload_param.device: 'nvme' with masters in the "
                                         r"compute dtype \(fp32 training.*needs "
                                         "zero_optimization.offload_optimizer.device"):
        run_ranks(_build, 1, fp32_alone)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad_path = _cfg(1, "bf16", tmp_path)
    bad_path["zero_optimization"]["offload_param"]["nvme_path"] = str(blocker)
    with pytest.raises(RankFailed, match="offload_param.nvme_path.*a_file"):
        run_ranks(_build, 1, bad_path)


# -- check-config's estimate against what a run holds ----------------------------------------
def _stats(rank, world, cfg):
    engine = _engine(cfg)
    train_engine(engine, batches(2), rank, world)
    return engine.optimizer.offload_stats(), engine.placement_plan.param_files.offload_stats()


@pytest.mark.parametrize("case", ["fp32", "bf16+opt"])
def test_check_config_estimate_matches_a_run(tmp_path, case):
    from zerolite.cli.check_config import count_params, summarize

    world = 2
    cfg = _cfg(world, case, tmp_path)
    opt, params = run_ranks(_stats, world, cfg)[0]
    summary = summarize(load_config(cfg, world_size=world), count_params(tiny_gpt()))
    est = summary["memory"]["offload_optimizer"]
    assert summary["memory"]["offload_optimizer_in_config"] == "nvme+params"
    row = est["nvme+params"]
    assert row["host"] - row["host_read_ahead"] == opt["buffer_bytes"]  # chunk buffers
    # No --model given: the read-ahead bound is every param shard of the rank.
    assert row["host_read_ahead"] == summary["memory"]["per_stage"][3]["params"]
    disk = opt["disk_bytes"] + params["disk_bytes"]
    # The run pads each shard to a multiple of the world size: a few elements more.
    assert 0 <= disk - row["disk"] < 0.01 * disk
    # What left the device is what went to disk (the optimizer's files hold two slots).
    moved = est["none"]["device"] - row["device"]
    assert moved == pytest.approx(row["disk"] - est["nvme"]["disk"] / 2 if case != "fp32"
                                  else row["disk"] / 2)
