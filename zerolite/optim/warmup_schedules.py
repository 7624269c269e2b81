"""Warmup schedules: WarmupLR, WarmupDecayLR (then linear decay), WarmupCosineLR (ratios,
then a cosine). Formulas and the departures from DeepSpeed's docs: see lr_schedules.py."""

from __future__ import annotations

import logging
import math
from typing import Any, List

from zerolite.optim.schedule_base import _checked, _group_lr, _per_group, _Schedule

logger = logging.getLogger("zerolite.optim.lr_schedules")


class WarmupLR(_Schedule):
    """lr = min_lr + (max_lr - min_lr) * gamma(it); gamma = log(it+1)/log(W) or it/W, 1 after W."""

    def __init__(self,
                 optimizer: Any,
                 warmup_min_lr: Any = 0.0,
                 warmup_max_lr: Any = None,
                 warmup_num_steps: int = 1000,
                 warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self._setup(optimizer, **_checked(
            "WarmupLR", warmup_min_lr=warmup_min_lr, warmup_max_lr=warmup_max_lr,
            warmup_num_steps=warmup_num_steps, warmup_type=warmup_type,
            last_batch_iteration=last_batch_iteration))

    def _setup(self, optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
               last_batch_iteration):
        super()._setup(optimizer, last_batch_iteration)
        if warmup_max_lr is None:  # each group warms up to its own lr (DeepSpeed 0.19)
            warmup_max_lr = [_group_lr(group) for group in self.optimizer.param_groups]
        self.min_lrs = _per_group("warmup_min_lr", warmup_min_lr, self._num_groups)
        self.max_lrs = _per_group("warmup_max_lr", warmup_max_lr, self._num_groups)
        self.delta_lrs = [hi - lo for lo, hi in zip(self.min_lrs, self.max_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        if self.last_batch_iteration == -1:
            self._apply_lr(self.get_lr())

    def _warmup_gamma(self) -> float:
        if self.warmup_type == "log":
            return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
        return self.last_batch_iteration / self.warmup_num_steps

    def _get_gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_gamma()
        return 1.0

    def get_lr(self) -> List[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._get_gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then gamma = max(0, (T - it) / max(1, T - W)) once it >= W."""

    def __init__(self,
                 optimizer: Any,
                 total_num_steps: int,
                 warmup_min_lr: Any = 0.0,
                 warmup_max_lr: Any = 0.001,
                 warmup_num_steps: int = 1000,
                 warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self._setup(optimizer, **_checked(
            "WarmupDecayLR", total_num_steps=total_num_steps, warmup_min_lr=warmup_min_lr,
            warmup_max_lr=warmup_max_lr, warmup_num_steps=warmup_num_steps,
            warmup_type=warmup_type, last_batch_iteration=last_batch_iteration))

    def _setup(self, optimizer, total_num_steps, warmup_min_lr, warmup_max_lr, warmup_num_steps,
               warmup_type, last_batch_iteration):
        self.total_num_steps = total_num_steps  # before the warmup: its first lr needs it
        super()._setup(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                       last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning("WarmupDecayLR: total_num_steps %d is less than warmup_num_steps %d",
                           self.total_num_steps, self.warmup_num_steps)

    def _get_gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_gamma()
        remaining = float(self.total_num_steps - self.last_batch_iteration)
        return max(0.0, remaining / float(max(1, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_Schedule):
    """lr = optimizer lr * ratio(it): warmup_min_ratio -> 1 over W, then cosine to cos_min_ratio."""

    def __init__(self,
                 optimizer: Any,
                 total_num_steps: int,
                 warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000,
                 cos_min_ratio: float = 0.0001,
                 warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self._setup(optimizer, **_checked(
            "WarmupCosineLR", total_num_steps=total_num_steps, warmup_min_ratio=warmup_min_ratio,
            warmup_num_steps=warmup_num_steps, cos_min_ratio=cos_min_ratio,
            warmup_type=warmup_type, last_batch_iteration=last_batch_iteration))

    def _setup(self, optimizer, total_num_steps, warmup_min_ratio, warmup_num_steps,
               cos_min_ratio, warmup_type, last_batch_iteration):
        super()._setup(optimizer, last_batch_iteration)
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = float(warmup_min_ratio)
        self.cos_min_ratio = float(cos_min_ratio)
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning("WarmupCosineLR: total_num_steps %d is less than warmup_num_steps %d",
                           self.total_num_steps, self.warmup_num_steps)
        # The peak lr of each group is whatever the optimizer was configured with.
        self.org_lrs = [_group_lr(group) for group in self.optimizer.param_groups]
        if self.last_batch_iteration == -1:
            self._apply_lr(self.get_lr())  # writes 0.0, as DeepSpeed does

    def get_lr_ratio(self) -> float:
        it = self.last_batch_iteration
        if it < 0:
            return 0.0
        if it < self.warmup_num_steps:
            if self.warmup_type == "log":
                ratio = self.inverse_log_warm_up * math.log(it + 1)
            else:
                ratio = it / self.warmup_num_steps
            return self.warmup_min_ratio + ratio * (1.0 - self.warmup_min_ratio)
        done = it - self.warmup_num_steps + 1
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        progress = min(1.0, done / span)
        ratio = (1.0 + math.cos(math.pi * progress)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)

    def get_lr(self) -> List[float]:
        if self.last_batch_iteration < 0:
            return [0.0] * len(self.org_lrs)
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]
