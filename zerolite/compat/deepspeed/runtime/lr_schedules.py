"""`deepspeed.runtime.lr_schedules`: zerolite's implementations of DeepSpeed's schedules."""
from zerolite.optim.lr_schedules import (  # noqa: F401
    SCHEDULER_TYPES, LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR,
)

VALID_LR_SCHEDULES = list(SCHEDULER_TYPES)
