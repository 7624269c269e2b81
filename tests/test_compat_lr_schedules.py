"""deepspeed.runtime.lr_schedules on the alias: DeepSpeed 0.19's name constants and helpers,
WarmupLR keeping each param group's own lr when warmup_max_lr is not given (from Python and
from a config), and argument errors of DeepSpeed's exception types (read from its source:
ValueError for bad values, TypeError for a non-optimizer, AssertionError for get_last_lr()
before any step)."""
import argparse

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.compat.deepspeed.runtime import lr_schedules as L


def two_groups(lr_a=0.1, lr_b=0.2):
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([{"params": [a], "lr": lr_a}, {"params": [b], "lr": lr_b}],
                           momentum=0.9)


def test_constants():
    assert (L.WARMUP_LR, L.WARMUP_DECAY_LR, L.WARMUP_COSINE_LR, L.ONE_CYCLE, L.LR_RANGE_TEST) == (
        "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
    assert L.VALID_LR_SCHEDULES == ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
                                    "WarmupCosineLR"]
    assert (L.WARMUP_LOG_RATE, L.WARMUP_LINEAR_RATE, L.TOTAL_NUM_STEPS, L.CYCLE_MAX_LR) == (
        "log", "linear", "total_num_steps", "cycle_max_lr")
    for name in L.VALID_LR_SCHEDULES:  # each constant names a class of the module
        assert getattr(L, name).__name__ == name


def test_warmup_lr_keeps_each_groups_lr():
    opt = two_groups()
    sched = L.WarmupLR(opt, warmup_num_steps=10, warmup_type="linear")
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    sched.step(5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.1])
    sched.step(20)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.2])
    assert sched.get_last_lr() == pytest.approx([0.1, 0.2])


def _config_built(rank, world):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    groups = [{"params": model[0].parameters(), "lr": 0.1},
              {"params": model[1].parameters(), "lr": 0.3}]
    cfg = {"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
           "scheduler": {"type": "WarmupLR",
                         "params": {"warmup_num_steps": 2, "warmup_type": "linear"}}}
    engine, opt, _, sched = zerolite.initialize(model=model, model_parameters=groups, config=cfg)
    sched.step(5)
    return [g["lr"] for g in opt.param_groups]


def test_warmup_lr_from_config_keeps_each_groups_lr():
    # in a rank process: initialize joins a process group, which this one must not keep
    assert run_ranks(_config_built, 1)[0] == pytest.approx([0.1, 0.3])


@pytest.mark.parametrize("make, kind, needle", [
    (lambda: L.WarmupLR(two_groups(), warmup_num_steps=0), ValueError, "warmup_num_steps"),
    (lambda: L.WarmupLR(two_groups(), warmup_num_steps=2.5), ValueError, "warmup_num_steps"),
    (lambda: L.WarmupLR(two_groups(), warmup_min_lr=[0.1]), ValueError, "warmup_min_lr"),
    (lambda: L.WarmupLR(object()), TypeError, "object"),
    (lambda: L.WarmupDecayLR(two_groups()), TypeError, "total_num_steps"),
    (lambda: L.WarmupDecayLR(two_groups(), total_num_steps=10, warmup_num_steps=0), ValueError,
     "warmup_num_steps"),
    (lambda: L.WarmupCosineLR(two_groups(), total_num_steps=10, warmup_num_steps=0), ValueError,
     "warmup_num_steps"),
    (lambda: L.WarmupCosineLR(two_groups()), TypeError, "total_num_steps"),
    (lambda: L.OneCycle(two_groups()), TypeError, "cycle_min_lr"),
    (lambda: L.OneCycle(two_groups(), 0.1, 0.2, cycle_first_step_size=0), ValueError,
     "cycle_first_step_size"),
    (lambda: L.OneCycle(two_groups(), 0.1, 0.2, cycle_second_step_size=-1), ValueError,
     "cycle_second_step_size"),
    (lambda: L.LRRangeTest(two_groups(), lr_range_test_step_size=0), ValueError,
     "lr_range_test_step_size"),
    (lambda: L.LRRangeTest(two_groups(), lr_range_test_min_lr=[0.1]), ValueError,
     "lr_range_test_min_lr"),
    (lambda: L.WarmupLR(two_groups(), last_batch_iteration=5).get_last_lr(), AssertionError,
     "step"),
])
def test_argument_errors_have_deepspeeds_types(make, kind, needle):
    with pytest.raises(kind, match=needle):
        make()


def test_tuning_arguments_and_config_helpers():
    parser = L.add_tuning_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--lr_schedule", "WarmupLR", "--warmup_max_lr", "0.02"])
    config, why = L.get_config_from_args(args)
    assert why is None and config == {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": 0.02, "warmup_num_steps": 1000, "warmup_type": "log"}}
    assert L.get_lr_from_config(config) == (0.02, "")
    opt = two_groups()
    L.WarmupLR(opt, **config["params"]).step(2000)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.02, 0.02])
    args = parser.parse_args(["--lr_schedule", "OneCycle"])
    config, _ = L.get_config_from_args(args)
    assert config["params"]["cycle_max_lr"] == 0.1 and "warmup_max_lr" not in config["params"]
    assert L.get_lr_from_config(config) == (0.1, "")
    assert L.get_config_from_args(parser.parse_args([]))[0] is None
    assert "not supported" in L.get_config_from_args(
        parser.parse_args(["--lr_schedule", "Cubic"]))[1]
    assert L.get_lr_from_config({"type": "WarmupCosineLR", "params": {}})[0] is None
    assert L.update_lr(opt.param_groups, [0.3, 0.4]) == [0.3, 0.4]
    wrapper = type("Wrapped", (), {"optimizer": opt})()
    assert L.get_torch_optimizer(wrapper) is opt
