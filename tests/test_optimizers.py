"""Optimizers from the config, applied to flat shards, against the same optimizer applied
per parameter in a single process; Lamb is refused by name; no_sync at stages 0-1."""
import pytest
import torch

import zerolite
from zerolite import ZeroliteConfigError
from zerolite.optim.flat_optimizers import Lion
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, batches, ds_config, tiny_gpt

STEPS = 6
CASES = {
    "SGD": ({"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01)),
    "Adagrad": ({"lr": 0.02}, lambda p: torch.optim.Adagrad(p, lr=0.02)),
    "Lion": ({"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1},
             lambda p: Lion(p, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)),
    "Adam": ({"lr": 3e-3, "adam_w_mode": False, "weight_decay": 0.01},  # L2, not decoupled
             lambda p: torch.optim.Adam(p, lr=3e-3, weight_decay=0.01)),
    # Names DeepSpeed looks up in torch.optim; torch's defaults apply to what is not given.
    "RMSprop": ({"lr": 1e-3, "momentum": 0.5, "centered": True},
                lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5, centered=True)),
    "Adamax": ({"betas": [0.8, 0.95]}, lambda p: torch.optim.Adamax(p, betas=(0.8, 0.95))),
    "NAdam": ({"weight_decay": 0.1, "decoupled_weight_decay": True},
              lambda p: torch.optim.NAdam(p, weight_decay=0.1, decoupled_weight_decay=True)),
    "RAdam": ({"lr": 3e-3}, lambda p: torch.optim.RAdam(p, lr=3e-3)),
    "Adadelta": ({"rho": 0.8}, lambda p: torch.optim.Adadelta(p, rho=0.8)),
}
UNTESTED = ("SGD", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta")
"""Not on DeepSpeed's list of ZeRO optimizers: the config needs zero_allow_untested_optimizer."""


def _train(rank, world, opt_type, params):
    cfg = ds_config(world)
    cfg["optimizer"] = {"type": opt_type, "params": params}
    cfg["zero_allow_untested_optimizer"] = opt_type in UNTESTED
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    losses = train_engine(engine, batches(STEPS), rank, world)
    return losses, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("opt_type", sorted(CASES))
def test_config_optimizer_matches_per_parameter_reference(opt_type):
    params, make = CASES[opt_type]
    ref_losses, ref_params = train_reference(tiny_gpt(), batches(STEPS), make, clip=CLIP)
    losses, got = run_ranks(_train, 2, opt_type, params)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        mine = got[name]
        if name.endswith("attn.qkv.bias"):
            # The key bias has a mathematically zero gradient (softmax ignores a shift along
            # the keys), so Adagrad and Lion (sign) turn fp32 summation noise into ±lr
            # steps there. Compare the query and value parts only.
            d = value.numel() // 3
            mine, value = torch.cat([mine[:d], mine[2 * d:]]), torch.cat([value[:d], value[2 * d:]])
        torch.testing.assert_close(mine, value, rtol=1e-5, atol=1e-5, msg=name)


def test_lamb_is_refused_by_name():
    cfg = ds_config(1)
    cfg["optimizer"] = {"type": "Lamb", "params": {"lr": 1e-3}}
    assert "optimizer.type: 'Lamb' is not supported" in run_ranks(_lamb, 1, cfg)[0]


def _lamb(rank, world, cfg):
    with pytest.raises(ZeroliteConfigError) as err:
        zerolite.initialize(model=tiny_gpt(), config=cfg)
    return str(err.value)


class _MyAdamW(torch.optim.AdamW):
    """A subclass: DeepSpeed's tested list is an exact type check, so it is untested."""


class _LarsSGD(torch.optim.SGD):
    """Shape-aware, as LARS: each parameter's step is scaled by its trust ratio
    ||p|| / ||g||, a whole-tensor norm that a flat shard does not have."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(p.norm() / (p.grad.norm() + 1e-12))
        return super().step(closure)


def _which_optimizers_initialize(rank, world):
    out = {}
    cases = {
        "AdamW stage 3": (3, lambda ps: torch.optim.AdamW(ps), {}),
        "subclass stage 2": (2, lambda ps: _MyAdamW(ps), {}),
        "subclass stage 2 allowed": (2, lambda ps: _MyAdamW(ps),
                                     {"zero_allow_untested_optimizer": True}),
        "callable SGD stage 1": (1, lambda ps: torch.optim.SGD, {}),
        "SGD stage 0": (0, lambda ps: torch.optim.SGD(ps, lr=0.1), {}),
        "LARS stage 0": (0, lambda ps: _LarsSGD(ps, lr=0.1), {}),
        "LARS stage 0 allowed": (0, lambda ps: _LarsSGD(ps, lr=0.1),
                                 {"zero_allow_untested_optimizer": True}),
        "offloaded AdamW": (3, lambda ps: torch.optim.AdamW(ps),
                            {"zero_optimization": {"stage": 3, "offload_optimizer": {
                                "device": "cpu"}}}),
        "offloaded AdamW allowed": (3, lambda ps: torch.optim.AdamW(ps), {
            "zero_force_ds_cpu_optimizer": False,
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}),
    }
    for name, (stage, make, extra) in cases.items():
        cfg = ds_config(world, stage=stage)
        del cfg["optimizer"]
        cfg.update(extra)
        model = tiny_gpt()
        opt = make(model.parameters())
        if opt is torch.optim.SGD:  # a callable taking the param groups
            opt = lambda groups: torch.optim.SGD(groups, lr=0.1)  # noqa: E731
            held = None
        else:
            held = [list(g["params"]) for g in opt.param_groups]
        try:
            zerolite.initialize(model=model, optimizer=opt, config=cfg)
            out[name] = "ok"
        except ZeroliteConfigError as e:
            out[name] = str(e)
            if held is not None:  # refused before anything was re-pointed
                assert [list(g["params"]) for g in opt.param_groups] == held
    return out


def test_optimizers_deepspeed_refuses_at_zero_stages_are_refused_with_the_key_to_allow_them():
    """DeepSpeed's rules (engine._configure_optimizer): at stages 1-3 only its tested classes
    unless zero_allow_untested_optimizer; offloaded, only DeepSpeedCPUAdam / CPULion unless
    zero_force_ds_cpu_optimizer is false. At stage 0 zerolite (flat buffers there too) takes
    element-wise torch classes and refuses the rest unless the same key allows them."""
    out = run_ranks(_which_optimizers_initialize, 1)[0]
    ok = {k for k, v in out.items() if v == "ok"}
    assert ok == {"AdamW stage 3", "subclass stage 2 allowed", "SGD stage 0",
                  "LARS stage 0 allowed", "offloaded AdamW allowed"}, out
    assert "_MyAdamW is not one DeepSpeed has tested with ZeRO stage 2" in out["subclass stage 2"]
    assert "torch.optim.sgd.SGD is not one" in out["callable SGD stage 1"]
    for name in ("subclass stage 2", "callable SGD stage 1", "LARS stage 0"):
        assert '"zero_allow_untested_optimizer": true' in out[name], out[name]
    assert "not an element-wise optimizer" in out["LARS stage 0"]
    assert '"zero_force_ds_cpu_optimizer": false' in out["offloaded AdamW"]


def _no_sync(rank, world, stage):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=stage))
    losses = []
    for batch in batches(STEPS):
        micro = rank_micro_batches(batch, rank, world, 2)
        total = 0.0
        with engine.no_sync():  # first micro-batch: no reduction
            loss = engine(*micro[0])
            engine.backward(loss)
            engine.step()
            total += loss.item()
        loss = engine(*micro[1])
        engine.backward(loss)
        engine.step()
        total += loss.item()
        t = torch.tensor(total, dtype=torch.float64)
        torch.distributed.all_reduce(t)
        losses.append(t.item() / (2 * world))
    return losses


@pytest.mark.parametrize("stage", [0, 1])
def test_no_sync_accumulates_locally(stage):
    from gpt_cases import reference_run

    ref_losses, _ = reference_run(STEPS)
    losses = run_ranks(_no_sync, 2, stage)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)


def _no_sync_stage3(rank, world):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=3))
    with engine.no_sync():
        pass


def test_no_sync_refused_at_stage_3():
    with pytest.raises(Exception, match="no_sync"):
        run_ranks(_no_sync_stage3, 2)
