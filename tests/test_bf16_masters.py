"""bf16 master weights and optimizer states (DeepSpeed's bf16.bf16_master_weights_and_grads /
bf16_optimizer_states) against the plain-torch algorithm of
zerolite/testing/bf16_reference.py (`train_bf16_masters_reference`), step for step, at world 2
with gradient accumulation and clipping; their memory; checkpoints; DeepSpeed's config rules.

Note: the tolerance is fp32-tight on purpose: a bf16 rounding placed differently (a gradient
accumulated in fp32 instead of bf16, a compensation dropped, a master rebuilt from fp32)
moves some weight by a bf16 ulp (~4e-3 relative) within a step or two.
"""
from __future__ import annotations

import os

import pytest
import torch

import zerolite
from zerolite.errors import ZeroliteConfigError
from zerolite.testing.bf16_reference import train_bf16_masters_reference
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, GAS, LR, WD, batches, ds_config, tiny_gpt

WORLD = 2
STEPS = 8


def _config(stage=3, rounding="kahan", states=True, offload=None, gas=GAS):
    cfg = ds_config(WORLD, stage=stage, bf16=True, gas=gas)
    cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=states)
    cfg["zerolite"] = {"master_rounding": rounding}
    if offload is not None:
        cfg["zero_optimization"]["offload_optimizer"] = offload
    return cfg


def _train(rank, world, cfg, steps=STEPS, separate_host=False):
    from zerolite.engine import ZeroEngine
    from zerolite.config import ZeroConfig

    model = tiny_gpt()
    if separate_host:  # the host hand-off for real on CPU (offload/host_placement.py)
        engine = ZeroEngine(model, ZeroConfig.from_dict(cfg, world), separate_host=True,
                            model_parameters=model.parameters())
    else:
        engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                         config=cfg)
    losses = train_engine(engine, batches(steps), rank, world)
    masters = {f: f.master.dtype for f in engine.sharded.flats if f.master is not None}
    return (losses, gather_full_state_dict(engine.sharded), set(masters.values()),
            type(engine.basic_optimizer).__name__)


def _reference(rounding="kahan", fp32_moments=False, steps=STEPS, gas=GAS, stage=3):
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks' kernels
    try:
        return train_bf16_masters_reference(
            tiny_gpt(), batches(steps), lambda m, x, y: m(x, y), world=WORLD, gas=gas, lr=LR,
            weight_decay=WD, clip=CLIP, rounding=rounding, fp32_moments=fp32_moments,
            reduce_each_micro_step=stage != 1)
    finally:
        torch.set_num_threads(saved)


def _assert_same(got, want):
    (losses, params, *_), (ref_losses, ref_params) = got, want
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-6, atol=0)
    assert params.keys() == ref_params.keys()
    for name, value in ref_params.items():
        assert params[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(params[name], value, rtol=0, atol=0,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("rounding", ["kahan", "nearest"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_masters_and_states_match_the_reference(stage, rounding):
    got = run_ranks(_train, WORLD, _config(stage, rounding))[0]
    assert got[2] == {torch.bfloat16} and got[3] == "FusedAdam"
    _assert_same(got, _reference(rounding, stage=stage))
    assert got[0][-1] < got[0][0] - 0.1  # it learns


def test_kahan_is_not_nearest():
    """The two roundings give different weights within the run (the test above can fail)."""
    kahan, nearest = _reference("kahan", steps=3)[1], _reference("nearest", steps=3)[1]
    assert any(not torch.equal(kahan[k], nearest[k]) for k in kahan)


def test_stochastic_rounding_trains():
    losses, params, dtypes, _ = run_ranks(_train, WORLD, _config(3, "stochastic"))[0]
    assert dtypes == {torch.bfloat16}
    ref = _reference("nearest")[0]
    assert losses[-1] < losses[0] - 0.1
    # unbiased rounding stays near the deterministic run over 8 steps
    assert abs(losses[-1] - ref[-1]) < 0.05 * ref[-1]


def test_bf16_masters_with_fp32_moments_offloaded_to_cpu():
    """DeepSpeed's pairing: bf16 masters, fp32 moments, offload_optimizer cpu (DeepSpeedCPUAdam);
    the host hand-off runs for real (separate host copies on CPU)."""
    cfg = _config(3, "kahan", states=False, offload={"device": "cpu"})
    got = run_ranks(_train, WORLD, cfg, STEPS, True)[0]
    assert got[3] == "DeepSpeedCPUAdam"
    _assert_same(got, _reference("kahan", fp32_moments=True))


def test_bf16_masters_and_states_offloaded_to_nvme(tmp_path):
    cfg = _config(3, "kahan", offload={"device": "nvme", "nvme_path": str(tmp_path)})
    cfg["zero_optimization"]["sub_group_size"] = 1000
    cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": str(tmp_path)}
    got = run_ranks(_train, WORLD, cfg)[0]
    _assert_same(got, _reference("kahan"))


def _memory(rank, world, cfg):
    model = tiny_gpt()
    num_params = sum(p.numel() for p in model.parameters())
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    x, y = batches(1)[0]
    for step in range(2):  # the second step has the optimizer state allocated
        for micro in range(GAS):
            lo = 4 * rank + 2 * micro
            engine.backward(engine(x[lo:lo + 2], y[lo:lo + 2]))
            if step == 1 and micro == GAS - 1:
                ms = engine.memory_stats()
            engine.step()
    return num_params, ms


@pytest.mark.parametrize("mode", ["fp32", "mixed", "bf16_masters_states", "kahan"])
def test_model_state_bytes_per_parameter_at_stage_3(mode):
    """Measured with memory_stats at the accumulation boundary: fp32 16, mixed 18, bf16
    masters + states 8, + kahan compensation 10 bytes per parameter (all ranks together)."""
    cfg = ds_config(WORLD, stage=3, bf16=mode != "fp32")
    if mode in ("bf16_masters_states", "kahan"):
        cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
        cfg["zerolite"] = {"master_rounding": "kahan" if mode == "kahan" else "nearest"}
    results = run_ranks(_memory, WORLD, cfg)
    num_params = results[0][0]
    total = sum(ms["param_shards"] + ms["grad_shards"] + ms["master_shards"]
                + ms["optimizer_state"] for _, ms in results)
    per_param = total / num_params
    want = {"fp32": 16, "mixed": 18, "bf16_masters_states": 8, "kahan": 10}[mode]
    # padding and Adam's per-flat step counters: a few bytes in ~100k parameters
    assert per_param == pytest.approx(want, rel=2e-3), per_param
    if mode == "kahan":
        assert per_param <= 10.01


def _save_load(rank, world, cfg, ckpt, mode):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    data = batches(6)
    if mode == "save":
        train_engine(engine, data[:3], rank, world)
        engine.save_checkpoint(ckpt, tag="t")
        losses = train_engine(engine, data[3:], rank, world)
    else:
        engine.load_checkpoint(ckpt, tag="t")
        state = engine.optimizer.state[next(f.master for f in engine.sharded.flats
                                            if f.master is not None)]
        assert state["exp_avg"].dtype == torch.bfloat16
        assert "master_compensation" in state and state["master_compensation"].abs().sum() > 0
        losses = train_engine(engine, data[3:], rank, world)
    return losses, gather_full_state_dict(engine.sharded)


def test_checkpoint_keeps_bf16_masters_moments_and_compensation(tmp_path):
    cfg = _config(3, "kahan")
    ckpt = str(tmp_path / "ckpt")
    straight = run_ranks(_save_load, WORLD, cfg, ckpt, "save")[0]
    resumed = run_ranks(_save_load, WORLD, cfg, ckpt, "load")[0]
    assert straight[0] == resumed[0]
    for name, value in straight[1].items():
        assert torch.equal(resumed[1][name], value), name


def _load_fp32_into_bf16(rank, world, ckpt, cfg_save, cfg_load):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg_save)
    train_engine(engine, batches(2), rank, world)
    engine.save_checkpoint(ckpt, tag="t")
    saved = gather_full_state_dict(engine.sharded)
    model = tiny_gpt(seed=5)
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg_load)
    engine.load_checkpoint(ckpt, tag="t")
    loaded = gather_full_state_dict(engine.sharded)
    losses = train_engine(engine, batches(2), rank, world)
    return saved, loaded, losses


def test_fp32_master_checkpoint_loads_into_bf16_masters(tmp_path):
    saved, loaded, losses = run_ranks(_load_fp32_into_bf16, WORLD, str(tmp_path / "c"),
                                      ds_config(WORLD, stage=3, bf16=True), _config())[0]
    for name, value in saved.items():
        assert loaded[name].dtype == torch.bfloat16
        assert torch.equal(loaded[name], value.to(torch.bfloat16)), name
    assert all(map(lambda v: v == v, losses))


@pytest.mark.parametrize("bf16, extra, match", [
    ({"bf16_master_weights_and_grads": True}, {}, "offload_optimizer"),
    ({"bf16_optimizer_states": True}, {}, "needs bf16.bf16_master_weights_and_grads"),
    ({"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
     {"stage": 0}, "stage 1, 2 or 3"),
])
def test_deepspeed_config_rules(bf16, extra, match):
    cfg = ds_config(1, stage=3, bf16=True)
    cfg["bf16"].update(bf16)
    cfg["zero_optimization"].update(extra)
    with pytest.raises(ZeroliteConfigError, match=match):
        zerolite.config.ZeroConfig.from_dict(cfg, 1)


def _client_optimizer(rank, world, cfg, which):
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("zerolite").addHandler(handler)
    model = tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=LR) if which == "torch" else None
    if which == "torch_adam":
        cfg["optimizer"]["params"]["torch_adam"] = True
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg, optimizer=opt)
    return type(engine.basic_optimizer).__name__, seen


def test_offloaded_bf16_masters_need_deepspeed_cpu_adam():
    """DeepSpeed asserts the optimizer is DeepSpeedCPUAdam when bf16 masters are offloaded."""
    cfg = _config(3, "kahan", states=False, offload={"device": "cpu"})
    with pytest.raises(Exception, match="DeepSpeedCPUAdam"):
        run_ranks(_client_optimizer, WORLD, cfg, "torch_adam")


def test_client_optimizer_on_bf16_masters_is_warned_about():
    name, seen = run_ranks(_client_optimizer, WORLD, _config(3, "kahan"), "torch")[0]
    assert name == "AdamW"
    assert any("master_rounding='kahan' applies to" in m for m in seen), seen
