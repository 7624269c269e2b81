"""Cycling and range-test schedules: OneCycle (lr and, inversely, momentum) and LRRangeTest.
Formulas and the departures from DeepSpeed's docs: see lr_schedules.py."""

from __future__ import annotations

import logging
import math
from typing import Any, List, Optional, Sequence

from zerolite.optim.schedule_base import _checked, _per_group, _Schedule

logger = logging.getLogger("zerolite.optim.lr_schedules")

# DeepSpeed's OneCycle writes (momentum, 0.99) into Adam-style betas.
_ONECYCLE_BETA2 = 0.99


class OneCycle(_Schedule):
    """1Cycle: min_lr -> max_lr over the first half, back over the second, then decay.

    With ``cycle_momentum``, momentum moves inversely (max_mom -> min_mom -> max_mom) as
    ``betas = (mom, 0.99)``, for an optimizer with ``betas`` in its defaults only: as in
    DeepSpeed, SGD's ``momentum`` is left alone (cycling is switched off, with a warning).
    """

    def __init__(self,
                 optimizer: Any,
                 cycle_min_lr: Any,
                 cycle_max_lr: Any,
                 decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000,
                 cycle_second_step_size: Optional[int] = None,
                 cycle_first_stair_count: int = 0,
                 cycle_second_stair_count: Optional[int] = None,
                 decay_step_size: int = 0,
                 cycle_momentum: bool = True,
                 cycle_min_mom: Any = 0.8,
                 cycle_max_mom: Any = 0.9,
                 decay_mom_rate: float = 0.0,
                 last_batch_iteration: int = -1):
        self._setup(optimizer, **_checked(
            "OneCycle", cycle_min_lr=cycle_min_lr, cycle_max_lr=cycle_max_lr,
            decay_lr_rate=decay_lr_rate, cycle_first_step_size=cycle_first_step_size,
            cycle_second_step_size=cycle_second_step_size,
            cycle_first_stair_count=cycle_first_stair_count,
            cycle_second_stair_count=cycle_second_stair_count, decay_step_size=decay_step_size,
            cycle_momentum=cycle_momentum, cycle_min_mom=cycle_min_mom,
            cycle_max_mom=cycle_max_mom, decay_mom_rate=decay_mom_rate,
            last_batch_iteration=last_batch_iteration))

    def _setup(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate, cycle_first_step_size,
               cycle_second_step_size, cycle_first_stair_count, cycle_second_stair_count,
               decay_step_size, cycle_momentum, cycle_min_mom, cycle_max_mom, decay_mom_rate,
               last_batch_iteration):
        super()._setup(optimizer, last_batch_iteration)
        n = self._num_groups

        # Cycle shape. Stair counts <= 0 (DeepSpeed's argparse default is -1) mean "no stairs".
        first = float(cycle_first_step_size)
        second = first if cycle_second_step_size is None else float(cycle_second_step_size)
        self.first_step_size = first
        self.second_step_size = second
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = cycle_first_stair_count
        if cycle_second_stair_count is None:
            self.second_stair_count = self.first_stair_count
        else:
            self.second_stair_count = cycle_second_stair_count
        self.decay_step_size = decay_step_size

        # Lr.
        self.min_lrs = _per_group("cycle_min_lr", cycle_min_lr, n)
        self.max_lrs = _per_group("cycle_max_lr", cycle_max_lr, n)
        self.decay_lr_rate = float(decay_lr_rate)
        no_decay = self.decay_step_size == 0
        self.skip_lr_decay = no_decay or self.decay_lr_rate == 0.0

        # Momentum.
        self.cycle_momentum = cycle_momentum
        self.min_moms = _per_group("cycle_min_mom", cycle_min_mom, n)
        self.max_moms = _per_group("cycle_max_mom", cycle_max_mom, n)
        self.decay_mom_rate = float(decay_mom_rate)
        self.skip_mom_decay = no_decay or self.decay_mom_rate == 0.0
        if self.cycle_momentum and "betas" not in getattr(self.optimizer, "defaults", {}):
            logger.warning("OneCycle: cycle_momentum disabled: optimizer %s has no 'betas' in "
                           "its defaults (DeepSpeed cycles Adam-style betas only)",
                           type(self.optimizer).__name__)
            self.cycle_momentum = False

        if self.last_batch_iteration == -1:
            self._apply_lr(self.min_lrs)
            if self.cycle_momentum:
                self._apply_mom(self.min_moms)  # DeepSpeed starts at cycle_min_mom (see lr_schedules)

    def _apply_mom(self, moms: Sequence[float]) -> None:
        for group, mom in zip(self.optimizer.param_groups, moms):
            group["betas"] = (mom, _ONECYCLE_BETA2)

    def _get_scale_factor(self) -> float:
        batch_iteration = self.last_batch_iteration + 1
        cycle = math.floor(1 + batch_iteration / self.total_size)
        x = 1.0 + batch_iteration / self.total_size - cycle
        if x <= self.step_ratio:
            scale = x / self.step_ratio
            stair_count = self.first_stair_count
        else:
            scale = (x - 1) / (self.step_ratio - 1)
            stair_count = self.second_stair_count
        if stair_count > 0:
            # Quantise from the integer position in the cycle, not from the float scale
            # (which can land a hair under an exact stair at a half-cycle boundary).
            position = batch_iteration % self.total_size
            if position <= self.first_step_size:
                stairs = position * stair_count / self.first_step_size
            else:
                stairs = (self.total_size - position) * stair_count / self.second_step_size
            scale = math.floor(stairs) / stair_count
        return scale

    def get_lr(self) -> List[float]:
        if self.last_batch_iteration < self.total_size:
            scale = self._get_scale_factor()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        decay_iteration = self.last_batch_iteration - self.total_size + 1
        factor = 1.0 + self.decay_lr_rate * (decay_iteration / self.decay_step_size)
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self) -> Optional[List[float]]:
        """Momentum (beta1 for Adam-style groups) per group, or None when not cycling."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._get_scale_factor()
            return [hi - (hi - lo) * scale for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        decay_iteration = self.last_batch_iteration - self.total_size + 1
        factor = 1.0 + self.decay_mom_rate * (decay_iteration / self.decay_step_size)
        return [hi * factor for hi in self.max_moms]

    def step(self, last_batch_iteration: Optional[int] = None, *, batch_iteration: Optional[int] = None) -> None:
        super().step(last_batch_iteration, batch_iteration=batch_iteration)
        if self.cycle_momentum:
            self._apply_mom(self.get_mom())


class LRRangeTest(_Schedule):
    """lr = min_lr * (1 + step_rate * (it + 1) / step_size), floor()ed when staircase."""

    def __init__(self,
                 optimizer: Any,
                 lr_range_test_min_lr: Any = 1e-3,
                 lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0,
                 lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        self._setup(optimizer, **_checked(
            "LRRangeTest", lr_range_test_min_lr=lr_range_test_min_lr,
            lr_range_test_step_size=lr_range_test_step_size,
            lr_range_test_step_rate=lr_range_test_step_rate,
            lr_range_test_staircase=lr_range_test_staircase,
            last_batch_iteration=last_batch_iteration))

    def _setup(self, optimizer, lr_range_test_min_lr, lr_range_test_step_size,
               lr_range_test_step_rate, lr_range_test_staircase, last_batch_iteration):
        super()._setup(optimizer, last_batch_iteration)
        self.min_lr = _per_group("lr_range_test_min_lr", lr_range_test_min_lr, self._num_groups)
        self.step_size = lr_range_test_step_size
        self.step_rate = float(lr_range_test_step_rate)
        self.staircase = lr_range_test_staircase
        if self.last_batch_iteration == -1:
            self._apply_lr(self.min_lr)

    def _interval(self) -> float:
        interval = float(self.last_batch_iteration + 1) / self.step_size
        return float(math.floor(interval)) if self.staircase else interval

    def get_lr(self) -> List[float]:
        increase = 1.0 + self.step_rate * self._interval()
        return [lr * increase for lr in self.min_lr]
