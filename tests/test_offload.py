"""offload_optimizer: NVMe (files) and CPU offload against no offload and the reference.

Every run uses gradient accumulation (2 micro-steps) and active clipping (gpt_cases.CLIP).
"""
import os

import pytest
import torch

import zerolite
from zerolite.config import load_config
from zerolite.errors import ZeroliteConfigError, ZeroliteError
from zerolite.offload.swap_files import SwapFiles
from zerolite.testing.multiprocess import RankFailed, run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from offload_cases import assert_same_run, train_then_die_mid_step
from gpt_cases import batches, ds_config, reference_run, tiny_gpt

STEPS, HALF = 6, 3
# Small chunks so every shard is cut into several (the tiny GPT's shards have ~300-9000 elements).
SUB = 1000


def _cfg(world, offload=None, stage=3, bf16=False, sub=SUB, optimizer=None, **extra):
    cfg = ds_config(world, stage=stage, bf16=bf16, **extra)
    if offload is not None:
        cfg["zero_optimization"].update(offload_optimizer=offload, sub_group_size=sub)
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    return cfg


def _engine(cfg):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _nvme(path, **extra):
    return {"device": "nvme", "nvme_path": str(path), **extra}


def _train(rank, world, cfg, steps=STEPS):
    engine = _engine(cfg)
    losses = train_engine(engine, batches(steps), rank, world)
    stats = engine.optimizer.offload_stats() if hasattr(engine.optimizer, "offload_stats") else None
    return (losses, gather_full_state_dict(engine.sharded), stats, engine.memory_stats(),
            engine.skipped_steps)




# -- parity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_nvme_offload_bitwise_equal_to_no_offload_and_tracks_reference(tmp_path, world):
    plain = run_ranks(_train, world, _cfg(world))[0]
    off = run_ranks(_train, world, _cfg(world, _nvme(tmp_path)))[0]
    assert_same_run(off, plain)
    ref_losses, ref_params = reference_run(STEPS)
    torch.testing.assert_close(torch.tensor(off[0]), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(off[1][name], value, rtol=1e-5, atol=1e-5)
    stats = off[2]
    assert stats["chunks_on_disk"] == stats["chunks"] > 4  # shards really are cut in chunks
    # What each step moves: every chunk's two Adam moments read (from step 2) and written.
    state_bytes = stats["disk_bytes"] // 2  # two slots per moment
    assert stats["bytes_written"] == STEPS * state_bytes
    assert stats["bytes_read"] == (STEPS - 1) * state_bytes
    # Resident optimizer state: only the two chunk buffer sets (2 moments x SUB fp32 each).
    assert off[3]["optimizer_state"] == 2 * 2 * SUB * 4 < plain[3]["optimizer_state"]


@pytest.mark.parametrize("case", ["bf16", "fp16", "warmup-lr", "ratio0.5", "stage2", "stage1",
                                  "sgd-momentum", "lion", "cpu"])
def test_offload_variants_bitwise_equal_to_no_offload(tmp_path, case):
    world, stage, bf16, opt, offload, extra = 2, 3, False, None, _nvme(tmp_path), {}
    if case == "fp16":  # dynamic loss scaling: skipped steps must not touch the files
        extra = {"fp16": {"enabled": True, "initial_scale_power": 30}}
    elif case == "warmup-lr":  # the schedule changes lr in the engine's param groups
        extra = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4,
                                                              "warmup_max_lr": 3e-3}}}
    elif case == "bf16":
        bf16 = True  # the fp32 masters are separate from the bf16 param shards
    elif case == "ratio0.5":
        offload = _nvme(tmp_path, ratio=0.5)
    elif case.startswith("stage"):
        stage = int(case[-1])
    elif case == "sgd-momentum":
        opt = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}}
        extra["zero_allow_untested_optimizer"] = True
    elif case == "lion":
        opt = {"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.01}}
    else:
        offload = {"device": "cpu"}  # CPU model: the in-memory path
    plain = run_ranks(_train, world, _cfg(world, stage=stage, bf16=bf16, optimizer=opt,
                                          **extra))[0]
    off = run_ranks(_train, world, _cfg(world, offload, stage=stage, bf16=bf16,
                                        optimizer=opt, **extra))[0]
    assert_same_run(off, plain)
    assert (off[4] > 0) == (case == "fp16") and off[4] == plain[4]
    if case == "ratio0.5":
        assert 0 < off[2]["chunks_on_disk"] < off[2]["chunks"]
        assert off[2]["resident_state_bytes"] > 0


# -- checkpoints across modes ---------------------------------------------------------------
def _save_half(rank, world, cfg, save_dir):
    engine = _engine(cfg)
    losses = train_engine(engine, batches(STEPS)[:HALF], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    return losses


def _resume(rank, world, cfg, save_dir):
    engine = _engine(cfg)
    engine.load_checkpoint(save_dir, tag="half")
    losses = train_engine(engine, batches(STEPS)[HALF:], rank, world)
    return losses, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("save_mode,load_mode", [("nvme", "none"), ("none", "nvme"),
                                                 ("nvme", "nvme")])
def test_resume_across_offload_modes_is_exact(tmp_path, save_mode, load_mode):
    world = 2
    mode = {"nvme": _cfg(world, _nvme(tmp_path / "swap")), "none": _cfg(world)}
    straight = run_ranks(_train, world, _cfg(world))[0]
    first = run_ranks(_save_half, world, mode[save_mode], str(tmp_path / "ckpt"))[0]
    # Resume at another chunk size, so the state really is re-cut on load.
    load_cfg = mode[load_mode]
    # Note: a multiple of 16: the fused host AdamW (optim/builder.py) runs a scalar tail on
    # each chunk's last (size mod 8) elements, which may differ from the vector lanes in the
    # last bit (e.g. 700: 2 of 200k elements, 7e-9); aligned chunk edges keep it bitwise.
    load_cfg["zero_optimization"]["sub_group_size"] = 704
    losses, params = run_ranks(_resume, world, load_cfg, str(tmp_path / "ckpt"))[0]
    assert_same_run((first + losses, params), straight)


# -- crash safety -----------------------------------------------------------------------------
def _killed_mid_step(rank, world, cfg, save_dir, kill_at_write):
    train_then_die_mid_step(_engine(cfg), rank, world, save_dir, STEPS, HALF, kill_at_write)


def test_nvme_kill_mid_step_then_restart_from_checkpoint(tmp_path):
    world, swap = 2, tmp_path / "swap"
    cfg = _cfg(world, _nvme(swap))
    straight = run_ranks(_train, world, _cfg(world))[0]
    with pytest.raises(RankFailed, match=r"rank \d"):
        # 19 chunks x 2 moments per step: write 45 is inside the second step after the save.
        run_ranks(_killed_mid_step, world, cfg, str(tmp_path / "ckpt"), 45)
    left = sorted(os.listdir(swap))
    assert len(left) == 2  # the dead run's swap dirs stay; a restart makes new ones
    losses, params = run_ranks(_resume, world, cfg, str(tmp_path / "ckpt"))[0]
    assert_same_run((straight[0][:HALF] + losses, params), straight)


def _torn_step(rank, world, cfg, save_dir):
    engine = _engine(cfg)
    train_engine(engine, batches(STEPS)[:HALF], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    real_write, writes = SwapFiles.write, [0]

    def failing_write(self, *args):
        writes[0] += 1
        if writes[0] == 5:
            raise OSError(28, "No space left on device")
        return real_write(self, *args)

    SwapFiles.write = failing_write
    with pytest.raises(OSError, match="No space"):
        train_engine(engine, batches(STEPS)[HALF:HALF + 1], rank, world)
    SwapFiles.write = real_write
    with pytest.raises(ZeroliteError, match="failed half-way"):
        engine.save_checkpoint(save_dir, tag="torn")
    assert open(os.path.join(save_dir, "latest")).read() == "half"
    # Loading the last good checkpoint into the same engine recovers it.
    engine.load_checkpoint(save_dir, tag="half")
    engine.zero_grad()  # the failed step's gradients
    losses = train_engine(engine, batches(STEPS)[HALF:], rank, world)
    return losses, gather_full_state_dict(engine.sharded)


def test_failed_step_cannot_be_checkpointed_and_reload_recovers(tmp_path):
    cfg = _cfg(1, _nvme(tmp_path / "swap"))
    straight = run_ranks(_train, 1, _cfg(1))[0]
    losses, params = run_ranks(_torn_step, 1, cfg, str(tmp_path / "ckpt"))[0]
    assert losses == straight[0][HALF:]
    assert all(torch.equal(params[k], v) for k, v in straight[1].items())


# -- bad input --------------------------------------------------------------------------------
def _build(rank, world, cfg):
    _engine(cfg)


def test_bad_offload_config_errors_name_the_key(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(RankFailed, match="offload_optimizer.nvme_path.*a_file"):
        run_ranks(_build, 1, _cfg(1, _nvme(blocker)))
    with pytest.raises(RankFailed, match="sub_group_size: got 0"):
        run_ranks(_build, 1, _cfg(1, _nvme(tmp_path), sub=0))
    with pytest.raises(ZeroliteConfigError, match="offload_optimizer.nvme_path"):
        load_config(_cfg(1, {"device": "nvme"}), world_size=1)


# -- check-config's offload estimate against what a run holds ---------------------------------
def test_check_config_offload_estimate_matches_a_run(tmp_path, capsys):
    from zerolite.cli.check_config import count_params, main, summarize

    world = 2
    cfg_dict = _cfg(world, _nvme(tmp_path / "swap"))
    stats = run_ranks(_train, world, cfg_dict, 2)[0][2]
    num = count_params(tiny_gpt())
    est = summarize(load_config(cfg_dict, world_size=world), num)["memory"]["offload_optimizer"]
    assert est["nvme"]["host"] == stats["buffer_bytes"]
    # The run pads each shard to a multiple of the world size: a few elements more.
    assert 0 <= stats["disk_bytes"] - est["nvme"]["disk"] < 0.01 * est["nvme"]["disk"]
    assert est["none"]["device"] == est["nvme"]["device"] + est["nvme"]["disk"] / 2
    path = tmp_path / "ds.json"
    path.write_text(__import__("json").dumps(cfg_dict))
    assert main([str(path), "--world-size", "2", "--params", str(num)]) == 0
    out = capsys.readouterr().out
    assert "offload choices at stage 3" in out and "nvme" in out.split("offload choices at")[1]


# -- the chunked optimizer on its own (no engine, no processes) -------------------------------
def _adamw_pair(tmp_path, sub, ratio=1.0):
    from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer

    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(1000)), torch.nn.Parameter(torch.randn(37))
    ref = [torch.nn.Parameter(p.detach().clone()) for p in (a, b)]
    base = torch.optim.AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], lr=0.01)
    off = ChunkedOffloadOptimizer(base, nvme_path=str(tmp_path), rank=0, sub_group_size=sub,
                                  ratio=ratio)
    plain = torch.optim.AdamW([{"params": [ref[0]]}, {"params": [ref[1]], "weight_decay": 0.0}],
                              lr=0.01)
    return (a, b), off, ref, plain


@pytest.mark.parametrize("sub,ratio", [(7, 1.0), (64, 1.0), (333, 0.5), (10 ** 9, 1.0)])
def test_chunked_adamw_equals_adamw_and_state_round_trips(tmp_path, sub, ratio):
    params, off, ref, plain = _adamw_pair(tmp_path, sub, ratio)
    assert len(off.state) == 0 and params[0] not in off.state
    for step in range(3):
        for p, q in zip(params, ref):
            g = torch.randn_like(p)
            p.grad, q.grad = g, g.clone()
        off.param_groups[0]["lr"] = plain.param_groups[0]["lr"] = 0.01 / (step + 1)
        off.step()
        plain.step()
    for p, q in zip(params, ref):
        assert torch.equal(p, q)
        got, want = off.state[p], plain.state[q]
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    off.state[params[0]] = {k: (v * 2 if v.dim() else v) for k, v in plain.state[ref[0]].items()}
    assert torch.equal(off.state[params[0]]["exp_avg"], 2 * plain.state[ref[0]]["exp_avg"])
    assert off.state.pop(params[1])["exp_avg"].shape == (37,) and params[1] not in off.state
    assert len(off.state) == 1


def test_torn_shard_refuses_reads_but_can_be_dropped_or_replaced(tmp_path):
    params, off, ref, plain = _adamw_pair(tmp_path, 100)
    for p in params:
        p.grad = torch.ones_like(p)
    off.step()
    real_write, calls = SwapFiles.write, [0]

    def failing_write(self, *args):
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(5, "Input/output error")
        return real_write(self, *args)

    SwapFiles.write = failing_write
    try:
        with pytest.raises(OSError):
            off.step()
    finally:
        SwapFiles.write = real_write
    with pytest.raises(ZeroliteError, match="failed half-way"):
        off.state[params[0]]
    assert off.state.pop(params[0]) is None and params[0] not in off.state
    with pytest.raises(ZeroliteError, match="failed half-way"):
        off.state.get(params[1])
    good = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(37), "exp_avg_sq": torch.ones(37)}
    off.state[params[1]] = good
    assert torch.equal(off.state[params[1]]["exp_avg_sq"], torch.ones(37))
