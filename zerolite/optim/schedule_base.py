"""What every learning-rate schedule shares: the optimizer it writes, stepping, state.

Argument rules live once, in `zerolite.config.optim.SCHEDULER_PARAMS`: a schedule built from
Python arguments checks them there (`_checked`), one built from a validated config section
(`from_config`) trusts it. Only what needs the optimizer (one value per param group, the
optimizer's own lr) is decided here.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from zerolite.config.optim import check_last_batch_iteration, check_scheduler_params
from zerolite.errors import ZeroliteConfigError, ZeroliteStateError


class NoLrYetError(ZeroliteStateError, AssertionError):
    """get_last_lr() before any lr was applied (DeepSpeed asserts; this is an AssertionError
    too)."""


def _checked(type_name: str, **given: Any) -> Dict[str, Any]:
    """`given` (keyword arguments of a schedule) checked by the config's rules; None means
    "not given" (a default the schedule resolves itself, or a missing required value)."""
    present = {k: v for k, v in given.items() if v is not None}
    out = check_scheduler_params(type_name, present)
    return {k: out.get(k) for k in given}


def torch_optimizer(optimizer: Any):
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


def _per_group(key: str, value: Any, num_groups: int) -> List[float]:
    """A float for every param group: one (checked) value repeated, or a list of one per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_groups:
            raise ZeroliteConfigError(
                f"scheduler.params.{key}: expected one value per optimizer param group "
                f"({num_groups}), got a list of {len(value)}: {list(value)!r}")
        return [float(v) for v in value]
    return [float(value)] * num_groups


class _Schedule:
    """Shared stepping / state logic. Subclasses implement ``_setup()`` and ``get_lr()``."""

    @classmethod
    def from_config(cls, optimizer: Any, params: Dict[str, Any]) -> "_Schedule":
        """Build from `SchedulerConfig.params` (validated, defaults filled): no re-checking."""
        self = cls.__new__(cls)
        self._setup(optimizer, **params)
        return self

    def _setup(self, optimizer: Any, last_batch_iteration: int) -> None:
        self.optimizer = torch_optimizer(optimizer)
        if not self.optimizer.param_groups:
            raise ValueError("optimizer has no param groups")
        self.last_batch_iteration = last_batch_iteration
        self._last_lr: Optional[List[float]] = None

    @property
    def _num_groups(self) -> int:
        return len(self.optimizer.param_groups)

    def get_lr(self) -> List[float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_last_lr(self) -> List[float]:
        """The lrs last written into the optimizer groups by this schedule."""
        if self._last_lr is None:
            raise NoLrYetError(
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
        self.last_batch_iteration = check_last_batch_iteration(last_batch_iteration)
        self._apply_lr(self.get_lr())

    def state_dict(self) -> Dict[str, int]:
        return {"last_batch_iteration": int(self.last_batch_iteration)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or "last_batch_iteration" not in state_dict:
            raise ValueError(f"{type(self).__name__}.load_state_dict: expected a dict with "
                             f"'last_batch_iteration', got {state_dict!r}")
        self.last_batch_iteration = check_last_batch_iteration(state_dict["last_batch_iteration"])
