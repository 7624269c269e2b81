"""`engine.optimizer`: the optimizer `initialize` returns, in the role of DeepSpeed's ZeRO
optimizer (DeepSpeedZeroOptimizer, ..._Stage3) around the torch optimizer that updates the
master shards (`engine.basic_optimizer`, also `engine.optimizer.optimizer`).

[Note: its step is the whole update] DeepSpeed's ZeRO optimizer, stepped directly, does the
whole update: the last gradient reduction, the fp16 overflow check and unscale, clipping to
`gradient_clipping`, the optimizer's step over the masters, and the copy back into the
parameters. Lightning Fabric steps it that way (`optimizer.step()`, not `engine.step()`), and
a program may too. So `step()` here runs the engine's update; what only `engine.step()` does
is the engine's bookkeeping around it (the accumulation boundary, the lr scheduler, the
global step), as in DeepSpeed. Everything else is the basic optimizer's: its param_groups
(the very list a scheduler over the client optimizer writes), state, state_dict.

Unlike DeepSpeed's, it is a torch.optim.Optimizer (without an Optimizer's own groups or
hooks), so a torch lr scheduler can also be built over it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from zerolite.errors import ZeroliteStateError


class ZeroOptimizer(torch.optim.Optimizer):
    def __init__(self, basic: torch.optim.Optimizer, update: Callable[[], None],
                 zero_grad: Callable[[bool], None]):
        # Optimizer.__init__ is not called: the groups, state and hooks are the basic one's.
        self.optimizer = basic
        self._update = update
        self._zero_grad = zero_grad
        self.overflow = False
        """True when the last update was skipped (fp16 overflow); Accelerate reads it."""

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ZeroliteStateError(
                "engine.optimizer.step(closure): a closure is not supported (DeepSpeed's ZeRO "
                "optimizer ignores it); run forward and backward yourself, then step()")
        self._update()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        raise ZeroliteStateError(
            "engine.optimizer.add_param_group: the engine's parameter groups are fixed when "
            "it is built (as DeepSpeed's ZeRO optimizers); pass every group to initialize")

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __getattr__(self, name):
        # Only for names not found above: the basic optimizer's own attributes.
        basic = self.__dict__.get("optimizer")
        if basic is None:
            raise AttributeError(name)
        return getattr(basic, name)

    def __repr__(self) -> str:
        return f"ZeroOptimizer({self.optimizer!r})"
