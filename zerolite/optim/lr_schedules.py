"""Learning-rate schedules that accept DeepSpeed's ``scheduler`` config section unchanged.

Five schedules, with DeepSpeed's names, parameter names, defaults and per-step formulas
(as in the current ``deepspeed/runtime/lr_schedules.py``):

``WarmupLR``        min_lr -> max_lr over ``warmup_num_steps`` (log or linear), then flat.
``WarmupDecayLR``   the same warmup, then linear decay to 0 at ``total_num_steps``.
``WarmupCosineLR``  ratios of the optimizer's own lr: warmup from ``warmup_min_ratio`` to 1,
                    then a cosine down to ``cos_min_ratio`` at ``total_num_steps``.
``OneCycle``        one triangular cycle (optionally in stairs) between ``cycle_min_lr`` and
                    ``cycle_max_lr``, then an optional inverse-time decay; momentum is cycled
                    inversely when ``cycle_momentum`` is set.
``LRRangeTest``     lr grows linearly (or in stairs) from ``lr_range_test_min_lr``.

Conventions shared with DeepSpeed: ``last_batch_iteration`` is the index of the last batch the
schedule was stepped for (-1: not started). Constructing a schedule with
``last_batch_iteration=-1`` writes the "before the first step" lr into the optimizer groups
(it does NOT call ``step()``); the engine then calls ``step()`` after every optimizer step, so
batch ``i`` (0-based) trains with the lr computed for iteration ``i - 1``.
``state_dict()`` is ``{"last_batch_iteration": int}``, the same dict DeepSpeed saves, so
checkpoints interchange; loading it does not touch the optimizer until the next ``step()``.

Note: where DeepSpeed's documentation and code disagree we follow the code:
  * ``WarmupLR``'s ``warmup_max_lr`` defaults to the optimizer's first group lr (docs: 0.001);
    ``WarmupDecayLR`` keeps 0.001.
  * ``warmup_num_steps`` is raised to at least 2 (``log(1)`` would divide by zero).
  * Linear warmup is ``it / warmup_num_steps`` (it reaches max_lr at ``it == warmup_num_steps``),
    log warmup is ``log(it + 1) / log(warmup_num_steps)`` (reaches max_lr one step earlier).
  * ``WarmupCosineLR`` sets lr to 0.0 at construction (not ``warmup_min_ratio * lr``), so the
    first optimizer step runs with lr 0. Its docstring says ``warmup_min_ratio`` is
    "float or list", but only a float is accepted; DeepSpeed's argparse helper says 0.01 for
    both ratios, the class defaults are 0.0 and 0.0001 (used here). The cosine progress is
    clamped to 1 (older DeepSpeed releases let it swing back up after ``total_num_steps``).
  * ``OneCycle``: the docstring says ``cycle_min_lr``/``cycle_max_lr`` are "float or list", the
    code only handles floats; we accept per-group lists too. The post-cycle decay is continuous
    (``1 + rate * k / decay_step_size``), not applied once per ``decay_step_size`` interval as
    the docs suggest; lr is divided by that factor but momentum is MULTIPLIED by it (so it
    grows). With momentum cycling, DeepSpeed writes ``betas = (momentum, 0.99)``: beta2 is
    forced to 0.99 whatever the optimizer had (reproduced here). At construction momentum is
    set to ``cycle_min_mom`` although the formula at that point gives ``cycle_max_mom``
    (reproduced). DeepSpeed only cycles Adam-style ``betas`` (and disables cycling for e.g.
    SGD); we also cycle ``momentum`` for SGD-style groups. Stair counts follow the current
    code (older releases ignored them).
  * An unknown ``warmup_type`` is an error here; DeepSpeed logs a warning and uses "log".
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from typing import Any, Dict, List, Optional, Sequence

import torch

from zerolite.errors import ZeroliteConfigError, ZeroliteStateError

__all__ = [
    "SCHEDULER_TYPES",
    "WARMUP_TYPES",
    "WarmupLR",
    "WarmupDecayLR",
    "WarmupCosineLR",
    "OneCycle",
    "LRRangeTest",
    "build_lr_scheduler",
]

logger = logging.getLogger(__name__)

SCHEDULER_TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
WARMUP_TYPES = ("log", "linear")

# DeepSpeed's OneCycle writes (momentum, 0.99) into Adam-style betas.
_ONECYCLE_BETA2 = 0.99


# ----------------------------------------------------------------------------------------------
# Validation helpers: every error names the config path scheduler.params.<key>.


def _where(key: str) -> str:
    return f"scheduler.params.{key}"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _as_float(key: str, value: Any, low: Optional[float] = None, high: Optional[float] = None) -> float:
    if not _is_number(value) or not math.isfinite(float(value)):
        raise ZeroliteConfigError(f"{_where(key)}: expected a finite number, got {value!r}")
    value = float(value)
    if low is not None and value < low:
        raise ZeroliteConfigError(f"{_where(key)}: must be >= {low}, got {value!r}")
    if high is not None and value > high:
        raise ZeroliteConfigError(f"{_where(key)}: must be <= {high}, got {value!r}")
    return value


def _as_count(key: str, value: Any, minimum: int) -> int:
    """An integer (an integral float such as JSON's 1e3 is accepted) that is >= minimum."""
    ok = _is_number(value) and math.isfinite(float(value)) and float(value) == int(value)
    if not ok:
        raise ZeroliteConfigError(f"{_where(key)}: expected an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ZeroliteConfigError(f"{_where(key)}: must be an integer >= {minimum}, got {value!r}")
    return value


def _as_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ZeroliteConfigError(f"{_where(key)}: expected true or false, got {value!r}")
    return value


def _per_group(key: str, value: Any, num_groups: int, low: Optional[float] = None,
               high: Optional[float] = None) -> List[float]:
    """A float for every param group: one value repeated, or a list with one per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_groups:
            raise ZeroliteConfigError(
                f"{_where(key)}: expected one value per optimizer param group "
                f"({num_groups}), got a list of {len(value)}: {list(value)!r}")
        return [_as_float(key, v, low, high) for v in value]
    return [_as_float(key, value, low, high)] * num_groups


def _warmup_type(value: Any) -> str:
    if value not in WARMUP_TYPES:
        raise ZeroliteConfigError(
            f"{_where('warmup_type')}: expected one of {list(WARMUP_TYPES)}, got {value!r}")
    return value


def _torch_optimizer(optimizer: Any):
    """The object whose ``param_groups`` the schedule writes (unwraps ``.optimizer`` once)."""
    if isinstance(getattr(optimizer, "param_groups", None), list):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(getattr(inner, "param_groups", None), list):
        return inner
    raise TypeError(f"{type(optimizer).__name__} has no param_groups; pass a torch.optim.Optimizer")


def _group_lr(group: Dict[str, Any]) -> float:
    lr = group["lr"]
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


# ----------------------------------------------------------------------------------------------


class _Schedule:
    """Shared stepping / state logic. Subclasses implement ``get_lr()``."""

    def __init__(self, optimizer: Any, last_batch_iteration: int):
        self.optimizer = _torch_optimizer(optimizer)
        if not self.optimizer.param_groups:
            raise ValueError("optimizer has no param groups")
        self.last_batch_iteration = _as_count("last_batch_iteration", last_batch_iteration, -1)
        self._last_lr: Optional[List[float]] = None

    @property
    def _num_groups(self) -> int:
        return len(self.optimizer.param_groups)

    def get_lr(self) -> List[float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_last_lr(self) -> List[float]:
        """The lrs last written into the optimizer groups by this schedule."""
        if self._last_lr is None:
            raise ZeroliteStateError(
                f"{type(self).__name__}.get_last_lr(): no lr has been applied yet; call step() first "
                "(a schedule built with last_batch_iteration != -1 applies nothing until step())")
        return list(self._last_lr)

    def _apply_lr(self, lrs: Sequence[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs):
            current = group["lr"]
            if isinstance(current, torch.Tensor):
                current.fill_(lr)  # keep a tensor lr a tensor (e.g. capturable/fused optimizers)
            else:
                group["lr"] = lr
        self._last_lr = [float(lr) for lr in lrs]

    def step(self, last_batch_iteration: Optional[int] = None, *, batch_iteration: Optional[int] = None) -> None:
        """Advance to ``last_batch_iteration`` (default: the next one) and write its lr.

        ``batch_iteration`` is accepted as an alias (DeepSpeed's name in OneCycle/LRRangeTest).
        """
        if last_batch_iteration is None:
            last_batch_iteration = batch_iteration
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = _as_count("last_batch_iteration", last_batch_iteration, -1)
        self._apply_lr(self.get_lr())

    def state_dict(self) -> Dict[str, int]:
        return {"last_batch_iteration": int(self.last_batch_iteration)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "last_batch_iteration" not in state_dict:
            raise ValueError(f"{type(self).__name__}.load_state_dict: expected a dict with "
                             f"'last_batch_iteration', got {state_dict!r}")
        self.last_batch_iteration = _as_count("last_batch_iteration", state_dict["last_batch_iteration"], -1)


class WarmupLR(_Schedule):
    """lr = min_lr + (max_lr - min_lr) * gamma(it); gamma = log(it+1)/log(W) or it/W, 1 after W."""

    def __init__(self,
                 optimizer: Any,
                 warmup_min_lr: Any = 0.0,
                 warmup_max_lr: Any = None,
                 warmup_num_steps: int = 1000,
                 warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        if warmup_max_lr is None:
            warmup_max_lr = _group_lr(self.optimizer.param_groups[0])
        self.min_lrs = _per_group("warmup_min_lr", warmup_min_lr, self._num_groups, low=0.0)
        self.max_lrs = _per_group("warmup_max_lr", warmup_max_lr, self._num_groups, low=0.0)
        self.delta_lrs = [hi - lo for lo, hi in zip(self.min_lrs, self.max_lrs)]
        self.warmup_num_steps = max(2, _as_count("warmup_num_steps", warmup_num_steps, 1))
        self.warmup_type = _warmup_type(warmup_type)
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
        self.total_num_steps = _as_count("total_num_steps", total_num_steps, 1)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
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
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = _as_count("total_num_steps", total_num_steps, 1)
        self.warmup_min_ratio = _as_float("warmup_min_ratio", warmup_min_ratio, 0.0, 1.0)
        self.cos_min_ratio = _as_float("cos_min_ratio", cos_min_ratio, 0.0, 1.0)
        self.warmup_num_steps = max(2, _as_count("warmup_num_steps", warmup_num_steps, 1))
        self.warmup_type = _warmup_type(warmup_type)
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


class OneCycle(_Schedule):
    """1Cycle: min_lr -> max_lr over the first half, back over the second, then decay.

    With ``cycle_momentum``, momentum moves inversely (max_mom -> min_mom -> max_mom): Adam-style
    groups get ``betas = (mom, 0.99)``, SGD-style groups get ``momentum = mom``.
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
        super().__init__(optimizer, last_batch_iteration)
        n = self._num_groups

        # Cycle shape. Stair counts <= 0 (DeepSpeed's argparse default is -1) mean "no stairs".
        first = float(_as_count("cycle_first_step_size", cycle_first_step_size, 1))
        if cycle_second_step_size is None:
            second = first
        else:
            second = float(_as_count("cycle_second_step_size", cycle_second_step_size, 1))
        self.first_step_size = first
        self.second_step_size = second
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = _as_count("cycle_first_stair_count", cycle_first_stair_count, -(2**62))
        if cycle_second_stair_count is None:
            self.second_stair_count = self.first_stair_count
        else:
            self.second_stair_count = _as_count("cycle_second_stair_count", cycle_second_stair_count, -(2**62))
        self.decay_step_size = _as_count("decay_step_size", decay_step_size, 0)

        # Lr.
        self.min_lrs = _per_group("cycle_min_lr", cycle_min_lr, n, low=0.0)
        self.max_lrs = _per_group("cycle_max_lr", cycle_max_lr, n, low=0.0)
        self.decay_lr_rate = _as_float("decay_lr_rate", decay_lr_rate, low=0.0)
        no_decay = self.decay_step_size == 0
        self.skip_lr_decay = no_decay or self.decay_lr_rate == 0.0

        # Momentum.
        self.cycle_momentum = _as_bool("cycle_momentum", cycle_momentum)
        self.min_moms = _per_group("cycle_min_mom", cycle_min_mom, n, low=0.0, high=1.0)
        self.max_moms = _per_group("cycle_max_mom", cycle_max_mom, n, low=0.0, high=1.0)
        self.decay_mom_rate = _as_float("decay_mom_rate", decay_mom_rate, low=0.0)
        self.skip_mom_decay = no_decay or self.decay_mom_rate == 0.0
        self._mom_kinds = [self._momentum_kind(group) for group in self.optimizer.param_groups]
        if self.cycle_momentum and not any(self._mom_kinds):
            logger.warning("OneCycle: cycle_momentum disabled: optimizer %s has neither 'betas' nor "
                           "'momentum' in its param groups", type(self.optimizer).__name__)
            self.cycle_momentum = False

        if self.last_batch_iteration == -1:
            self._apply_lr(self.min_lrs)
            if self.cycle_momentum:
                self._apply_mom(self.min_moms)  # DeepSpeed starts at cycle_min_mom (see module Note)

    @staticmethod
    def _momentum_kind(group: Dict[str, Any]) -> Optional[str]:
        if "betas" in group:
            return "betas"
        if "momentum" in group:
            return "momentum"
        return None

    def _apply_mom(self, moms: Sequence[float]) -> None:
        for group, kind, mom in zip(self.optimizer.param_groups, self._mom_kinds, moms):
            if kind == "betas":
                group["betas"] = (mom, _ONECYCLE_BETA2)
            elif kind == "momentum":
                group["momentum"] = mom

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
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = _per_group("lr_range_test_min_lr", lr_range_test_min_lr, self._num_groups, low=0.0)
        self.step_size = _as_count("lr_range_test_step_size", lr_range_test_step_size, 1)
        self.step_rate = _as_float("lr_range_test_step_rate", lr_range_test_step_rate, low=0.0)
        self.staircase = _as_bool("lr_range_test_staircase", lr_range_test_staircase)
        if self.last_batch_iteration == -1:
            self._apply_lr(self.min_lr)

    def _interval(self) -> float:
        interval = float(self.last_batch_iteration + 1) / self.step_size
        return float(math.floor(interval)) if self.staircase else interval

    def get_lr(self) -> List[float]:
        increase = 1.0 + self.step_rate * self._interval()
        return [lr * increase for lr in self.min_lr]


_CLASSES = {
    "WarmupLR": WarmupLR,
    "WarmupDecayLR": WarmupDecayLR,
    "WarmupCosineLR": WarmupCosineLR,
    "OneCycle": OneCycle,
    "LRRangeTest": LRRangeTest,
}


def build_lr_scheduler(optimizer: Any, type_name: str, params: Optional[Dict[str, Any]] = None):
    """Build the schedule a DeepSpeed ``"scheduler": {"type": ..., "params": {...}}`` describes."""
    cls = _CLASSES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        hint = ""
        if isinstance(type_name, str):
            close = [name for name in SCHEDULER_TYPES if name.lower() == type_name.lower()]
            if close:
                hint = f" (names are case-sensitive: did you mean {close[0]!r}?)"
        raise ZeroliteConfigError(
            f"scheduler.type: unknown scheduler type {type_name!r}{hint}; "
            f"supported: {', '.join(SCHEDULER_TYPES)}")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ZeroliteConfigError(f"scheduler.params: expected an object of parameters, got {params!r}")

    signature = inspect.signature(cls.__init__)
    accepted = [name for name in signature.parameters if name not in ("self", "optimizer")]
    for key in params:
        if key not in accepted:
            raise ZeroliteConfigError(
                f"{_where(key)}: unknown parameter for {type_name}; accepted: {', '.join(accepted)}")
    for name in accepted:
        if signature.parameters[name].default is inspect.Parameter.empty and name not in params:
            raise ZeroliteConfigError(f"{_where(name)}: required by {type_name} but missing")
    return cls(optimizer, **params)
