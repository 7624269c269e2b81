"""`deepspeed.runtime.lr_schedules`: zerolite's implementations of DeepSpeed's schedules
(zerolite/optim/lr_schedules.py), DeepSpeed's name constants and its small helpers: the
command-line arguments of the schedules (`add_tuning_arguments`, `get_config_from_args`),
`get_lr_from_config`, `update_lr`, `get_torch_optimizer`."""
from __future__ import annotations

import argparse

from zerolite.optim.lr_schedules import (  # noqa: F401
    SCHEDULER_TYPES, LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR,
)
from zerolite.optim.schedule_base import torch_optimizer

LR_SCHEDULE = "lr_schedule"
LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

LR_RANGE_TEST_MIN_LR = "lr_range_test_min_lr"
LR_RANGE_TEST_STEP_RATE = "lr_range_test_step_rate"
LR_RANGE_TEST_STEP_SIZE = "lr_range_test_step_size"
LR_RANGE_TEST_STAIRCASE = "lr_range_test_staircase"
EDGE_VALUE = "edge_value"
MID_VALUE = "mid_value"
CYCLE_FIRST_STEP_SIZE = "cycle_first_step_size"
CYCLE_FIRST_STAIR_COUNT = "cycle_first_stair_count"
CYCLE_SECOND_STEP_SIZE = "cycle_second_step_size"
CYCLE_SECOND_STAIR_COUNT = "cycle_second_stair_count"
DECAY_STEP_SIZE = "decay_step_size"
CYCLE_MIN_LR = "cycle_min_lr"
CYCLE_MAX_LR = "cycle_max_lr"
DECAY_LR_RATE = "decay_lr_rate"
CYCLE_MIN_MOM = "cycle_min_mom"
CYCLE_MAX_MOM = "cycle_max_mom"
DECAY_MOM_RATE = "decay_mom_rate"
WARMUP_MIN_LR = "warmup_min_lr"
WARMUP_MAX_LR = "warmup_max_lr"
WARMUP_NUM_STEPS = "warmup_num_steps"
WARMUP_TYPE = "warmup_type"
WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
WARMUP_MIN_RATIO = "warmup_min_ratio"
COS_MIN_RATIO = "cos_min_ratio"
TOTAL_NUM_STEPS = "total_num_steps"

# (flag, type or "flag", default, help) of `add_tuning_arguments`, DeepSpeed's defaults.
_ARGS = [
    (LR_RANGE_TEST_MIN_LR, float, 0.001, "Starting lr value."),
    (LR_RANGE_TEST_STEP_RATE, float, 1.0, "scaling rate for LR range test."),
    (LR_RANGE_TEST_STEP_SIZE, int, 1000, "training steps per LR change."),
    (LR_RANGE_TEST_STAIRCASE, "flag", False, "use staircase scaling for LR range test."),
    (CYCLE_FIRST_STEP_SIZE, int, 1000, "size of first step of 1Cycle schedule (training steps)."),
    (CYCLE_FIRST_STAIR_COUNT, int, -1, "first stair count for 1Cycle schedule."),
    (CYCLE_SECOND_STEP_SIZE, int, -1, "size of second step of 1Cycle schedule."),
    (CYCLE_SECOND_STAIR_COUNT, int, -1, "second stair count for 1Cycle schedule."),
    (DECAY_STEP_SIZE, int, 1000, "size of intervals for applying post cycle decay."),
    (CYCLE_MIN_LR, float, 0.01, "1Cycle LR lower bound."),
    (CYCLE_MAX_LR, float, 0.1, "1Cycle LR upper bound."),
    (DECAY_LR_RATE, float, 0.0, "post cycle LR decay rate."),
    ("cycle_momentum", "flag", False, "Enable 1Cycle momentum schedule."),
    (CYCLE_MIN_MOM, float, 0.8, "1Cycle momentum lower bound."),
    (CYCLE_MAX_MOM, float, 0.9, "1Cycle momentum upper bound."),
    (DECAY_MOM_RATE, float, 0.0, "post cycle momentum decay rate."),
    (WARMUP_MIN_LR, float, 0, "WarmupLR minimum/initial LR value"),
    (WARMUP_MAX_LR, float, 0.001, "WarmupLR maximum LR value."),
    (WARMUP_NUM_STEPS, int, 1000, "WarmupLR step count for LR warmup."),
    (WARMUP_TYPE, str, WARMUP_LOG_RATE, "WarmupLR increasing function during warmup"),
    (WARMUP_MIN_RATIO, float, 0.01, "Cosine LR lower bound."),
    (COS_MIN_RATIO, float, 0.01, "Cosine LR lower bound."),
]

# Which of those arguments each schedule takes from the command line (DeepSpeed's choice:
# WarmupDecayLR reads WarmupLR's, so total_num_steps must come from elsewhere).
_FROM_ARGS = {
    LR_RANGE_TEST: [LR_RANGE_TEST_MIN_LR, LR_RANGE_TEST_STEP_RATE, LR_RANGE_TEST_STEP_SIZE,
                    LR_RANGE_TEST_STAIRCASE],
    ONE_CYCLE: [CYCLE_FIRST_STEP_SIZE, CYCLE_FIRST_STAIR_COUNT, CYCLE_SECOND_STEP_SIZE,
                CYCLE_SECOND_STAIR_COUNT, DECAY_STEP_SIZE, CYCLE_MIN_LR, CYCLE_MAX_LR,
                DECAY_LR_RATE, CYCLE_MIN_MOM, CYCLE_MAX_MOM, DECAY_MOM_RATE],
    WARMUP_LR: [WARMUP_MIN_LR, WARMUP_MAX_LR, WARMUP_NUM_STEPS, WARMUP_TYPE],
    WARMUP_DECAY_LR: [WARMUP_MIN_LR, WARMUP_MAX_LR, WARMUP_NUM_STEPS, WARMUP_TYPE],
    WARMUP_COSINE_LR: [WARMUP_NUM_STEPS, WARMUP_TYPE, WARMUP_MIN_RATIO, COS_MIN_RATIO],
}


def add_tuning_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--lr_schedule` and every schedule's parameters as command-line flags."""
    group = parser.add_argument_group("Convergence Tuning", "Convergence tuning configurations")
    group.add_argument(f"--{LR_SCHEDULE}", type=str, default=None, help="LR schedule for training.")
    for name, kind, default, text in _ARGS:
        if kind == "flag":
            group.add_argument(f"--{name}", default=default, action="store_true", help=text)
        else:
            group.add_argument(f"--{name}", type=kind, default=default, help=text)
    return parser


def parse_arguments():
    parser = add_tuning_arguments(argparse.ArgumentParser())
    return parser.parse_known_args()


def get_config_from_args(args):
    """(`{"type", "params"}` from `--lr_schedule` and its flags, None) or (None, why not)."""
    schedule = getattr(args, LR_SCHEDULE, None)
    if schedule is None:
        return None, f"--{LR_SCHEDULE} not specified on command line"
    if schedule not in VALID_LR_SCHEDULES:
        return None, f"{schedule} is not supported LR schedule"
    params = {k: getattr(args, k) for k in _FROM_ARGS[schedule]
              if getattr(args, k, None) is not None}
    return {"type": schedule, "params": params}, None


def get_lr_from_config(config: dict):
    """(the lr a schedule config names, "") or (None, why not)."""
    if "type" not in config:
        return None, "LR schedule type not defined in config"
    if "params" not in config:
        return None, "LR schedule params not defined in config"
    kind, params = config["type"], config["params"]
    if kind not in VALID_LR_SCHEDULES:
        return None, f"{kind} is not a valid LR schedule"
    if kind == WARMUP_COSINE_LR:
        return None, (f"{WARMUP_COSINE_LR} scales the optimizer learning rate by a ratio, so its "
                      "params define no lr")
    key = {LR_RANGE_TEST: LR_RANGE_TEST_MIN_LR, ONE_CYCLE: CYCLE_MAX_LR}.get(kind, WARMUP_MAX_LR)
    return params[key], ""


def update_lr(param_groups, lrs):
    """Write one lr per group (a tensor lr is filled in place); returns the groups' lrs."""
    for group, lr in zip(param_groups, lrs):
        if hasattr(group["lr"], "fill_"):
            group["lr"].fill_(lr.squeeze() if hasattr(lr, "squeeze") else lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in param_groups]


def get_torch_optimizer(optimizer):
    """`optimizer`, or the optimizer it wraps as `.optimizer` (TypeError otherwise)."""
    return torch_optimizer(optimizer)


__all__ = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest",
           "VALID_LR_SCHEDULES", "LR_SCHEDULE", "LR_RANGE_TEST", "ONE_CYCLE", "WARMUP_LR",
           "WARMUP_DECAY_LR", "WARMUP_COSINE_LR", "add_tuning_arguments", "parse_arguments",
           "get_config_from_args", "get_lr_from_config", "update_lr", "get_torch_optimizer"]
