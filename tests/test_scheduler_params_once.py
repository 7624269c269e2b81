"""One set of rules for schedule parameters: a config section and the same parameters passed
from Python get the same verdict, and the engine's schedule (built from the validated config)
steps exactly like one built from the raw parameters."""
import warnings

import pytest
import torch

from zerolite.config import ZeroliteConfigWarning, load_config
from zerolite.errors import ZeroliteConfigError
from zerolite.optim.lr_schedules import build_lr_scheduler, build_lr_scheduler_from_config

from test_lr_schedules import ALL_CONFIGS, make_opt


def _config(type_name, params):
    return {"train_batch_size": 8, "scheduler": {"type": type_name, "params": params}}


def _verdict(fn):
    try:
        fn()
    except ZeroliteConfigError as e:
        return str(e).split(":")[0]  # the path the error names
    return "ok"


@pytest.mark.parametrize("type_name,params,want", [
    # Used to load with a warning and then fail when the engine built the schedule.
    ("WarmupLR", {"warmup_max_lr": 0.1, "lr": 0.1}, "scheduler.params.lr"),
    # Used to pass the config and fail in the schedule.
    ("WarmupLR", {"warmup_num_steps": 0}, "scheduler.params.warmup_num_steps"),
    ("WarmupLR", {"last_batch_iteration": -2}, "scheduler.params.last_batch_iteration"),
    ("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_max_mom": 1.5},
     "scheduler.params.cycle_max_mom"),
    # Used to fail the config although the schedule accepts them.
    ("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_first_stair_count": -1}, "ok"),
    ("OneCycle", {"cycle_min_lr": [0.1], "cycle_max_lr": [1.0]}, "ok"),
    ("LRRangeTest", {"lr_range_test_min_lr": [1e-3]}, "ok"),
])
def test_config_and_builder_give_one_verdict(type_name, params, want):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroliteConfigWarning)  # no "unknown key" warning either
        from_config = _verdict(lambda: load_config(_config(type_name, params), 1))
    from_python = _verdict(lambda: build_lr_scheduler(make_opt(), type_name, dict(params)))
    assert from_config == from_python == want


@pytest.mark.parametrize("type_name,params", ALL_CONFIGS)
def test_schedule_from_config_steps_like_raw_build(type_name, params):
    cfg = load_config(_config(type_name, params), 1).scheduler
    a_opt, b_opt = make_opt(), make_opt()
    a = build_lr_scheduler_from_config(a_opt, cfg)
    b = build_lr_scheduler(b_opt, type_name, dict(params))
    assert type(a) is type(b)
    for _ in range(520):  # past every warmup, cycle and decay start in ALL_CONFIGS
        a.step()
        b.step()
        assert a_opt.param_groups[0]["lr"] == b_opt.param_groups[0]["lr"]
        assert a_opt.param_groups[0]["betas"] == b_opt.param_groups[0]["betas"]
    assert a.state_dict() == b.state_dict()
