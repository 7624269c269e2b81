"""DeepSpeed's optimizer classes (deepspeed.ops.*) passed as `optimizer=` run on zerolite's
fp32 shards with DeepSpeed's arguments and give the update of the torch optimizer they name
(world 2, ZeRO-3, against a single-process reference)."""
import copy

import pytest
import torch

import zerolite
from zerolite.compat.deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from zerolite.compat.deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from zerolite.compat.deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
from zerolite.optim.flat_optimizers import Lion
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import batches, ds_config, tiny_gpt

STEPS = 4
# Note: Adagrad's eps is raised from DeepSpeed's 1e-10: with it, a near-zero gradient moves a
# weight by about lr x sign(grad), so reduction-order rounding flips single embedding rows.
CASES = {
    "FusedAdam": (FusedAdam, dict(lr=3e-3, weight_decay=0.1),
                  torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.1)),
    "FusedAdam-L2": (FusedAdam, dict(lr=3e-3, weight_decay=0.1, adam_w_mode=False),
                     torch.optim.Adam, dict(lr=3e-3, weight_decay=0.1)),
    "DeepSpeedCPUAdam": (DeepSpeedCPUAdam, dict(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.05),
                         torch.optim.AdamW, dict(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.05)),
    "DeepSpeedCPUAdam-L2": (DeepSpeedCPUAdam, dict(lr=2e-3, weight_decay=0.05, adamw_mode=False),
                            torch.optim.Adam, dict(lr=2e-3, weight_decay=0.05)),
    "DeepSpeedCPUAdagrad": (DeepSpeedCPUAdagrad, dict(lr=5e-2, eps=1e-4, weight_decay=0.01),
                            torch.optim.Adagrad, dict(lr=5e-2, eps=1e-4, weight_decay=0.01)),
    "DeepSpeedCPULion": (DeepSpeedCPULion, dict(lr=1e-3, weight_decay=0.1),
                         Lion, dict(lr=1e-3, weight_decay=0.1)),
    "FusedLion": (FusedLion, dict(lr=1e-3, betas=(0.95, 0.98)), Lion,
                  dict(lr=1e-3, betas=(0.95, 0.98))),
}


def _train(rank, world, name):
    cls, kwargs, _, _ = CASES[name]
    model = tiny_gpt()
    config = ds_config(world, stage=3, gradient_clipping=0.0)
    del config["optimizer"]
    engine, optimizer, *_ = zerolite.initialize(model=model, optimizer=cls(model.parameters(),
                                                                           **kwargs),
                                                config=config)
    losses = train_engine(engine, batches(STEPS), rank, world)
    return losses, gather_full_state_dict(engine.sharded), type(optimizer.optimizer).__name__


@pytest.mark.parametrize("name", sorted(CASES))
def test_deepspeed_optimizer_class_matches_its_torch_update(name):
    _, _, ref_cls, ref_kwargs = CASES[name]
    ref_losses, ref_params = train_reference(copy.deepcopy(tiny_gpt()), batches(STEPS),
                                             lambda p: ref_cls(p, **ref_kwargs))
    losses, params, opt_name = run_ranks(_train, 2, name)[0]
    assert opt_name == CASES[name][0].__name__  # rebuilt over the shards with the same class
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for key, value in ref_params.items():
        torch.testing.assert_close(params[key], value, rtol=1e-5, atol=1e-5, msg=key)


# -- the class a config's optimizer.type builds (DeepSpeed's _configure_basic_optimizer) ------
CONFIG_CLASSES = [  # (type, extra params, offload_optimizer?, class initialize returns)
    ("Adam", {}, False, FusedAdam), ("AdamW", {}, False, FusedAdam),
    ("Adam", {}, True, DeepSpeedCPUAdam), ("AdamW", {}, True, DeepSpeedCPUAdam),
    ("Adam", {"torch_adam": True}, False, torch.optim.AdamW),
    ("Adam", {"torch_adam": True, "adam_w_mode": False}, True, torch.optim.Adam),
    ("Adagrad", {}, False, torch.optim.Adagrad), ("Adagrad", {}, True, DeepSpeedCPUAdagrad),
    ("Lion", {}, False, FusedLion), ("Lion", {}, True, DeepSpeedCPULion),
]


def _config_optimizer_classes(rank, world):
    out = []
    for stage in (0, 1, 2, 3):
        for type_name, extra, offload, _ in CONFIG_CLASSES:
            if offload and stage == 0:
                continue  # offload needs ZeRO (as in DeepSpeed)
            config = ds_config(world, stage=stage)
            config["optimizer"] = {"type": type_name, "params": {"lr": 1e-3, **extra}}
            if offload:
                config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
            engine, optimizer, *_ = zerolite.initialize(model=tiny_gpt(), config=config)
            # As DeepSpeed: initialize returns the ZeRO optimizer, whose .optimizer is the
            # basic one the config built (engine.basic_optimizer).
            out.append((stage, type_name, tuple(extra), offload, type(optimizer.optimizer),
                        optimizer is engine.optimizer
                        and optimizer.optimizer is engine.basic_optimizer,
                        [g.get("decoupled_weight_decay") for g in optimizer.param_groups]))
    return out


def test_config_optimizer_is_the_class_deepspeed_builds():
    expected = {(t, tuple(e), o): cls for t, e, o, cls in CONFIG_CLASSES}
    for stage, type_name, extra, offload, cls, same, decoupled in run_ranks(
            _config_optimizer_classes, 1)[0]:
        where = (stage, type_name, extra, offload)
        assert cls is expected[(type_name, extra, offload)], where
        assert same, where
        if type_name in ("Adam", "AdamW"):  # AdamW maths unless adam_w_mode is false
            assert set(decoupled) == {"adam_w_mode" not in extra}, where


def test_config_adam_trains_like_torch_adamw():
    """The switch from torch.optim.AdamW to FusedAdam for a config "Adam" changes nothing."""
    ref = train_reference(tiny_gpt(), batches(STEPS), lambda ps: torch.optim.AdamW(
        ps, lr=3e-3, weight_decay=0.1), clip=0.0)[0]
    losses = run_ranks(_config_adam, 2)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-5, atol=0)


def _config_adam(rank, world):
    config = ds_config(world, stage=3, gradient_clipping=0.0)
    config["optimizer"] = {"type": "Adam", "params": {"lr": 3e-3, "weight_decay": 0.1}}
    engine, optimizer, *_ = zerolite.initialize(model=tiny_gpt(), config=config)
    assert isinstance(optimizer.optimizer, FusedAdam)
    return train_engine(engine, batches(STEPS), rank, world)
