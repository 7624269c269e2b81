"""fp16 loss scaling with DeepSpeed's semantics (static when loss_scale > 0, else dynamic).

Dynamic: on overflow the step is skipped and, once `hysteresis` overflows have been
absorbed, the scale halves (never below `min_loss_scale`); after `loss_scale_window`
iterations without overflow it doubles. With `consecutive_hysteresis`, every clean
iteration refills the hysteresis budget.
"""
from __future__ import annotations

import logging

logger = logging.getLogger("zerolite")


class LossScaler:
    def __init__(self, *, loss_scale: float = 0.0, initial_scale_power: int = 16,
                 loss_scale_window: int = 1000, hysteresis: int = 2,
                 consecutive_hysteresis: bool = False, min_loss_scale: float = 1.0):
        self.dynamic = loss_scale == 0
        self.cur_scale = float(2 ** initial_scale_power) if self.dynamic else float(loss_scale)
        self.scale_window = loss_scale_window
        self.delayed_shift = hysteresis
        self.cur_hysteresis = hysteresis
        self.consecutive_hysteresis = consecutive_hysteresis
        self.min_scale = float(min_loss_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1

    @classmethod
    def from_config(cls, fp16) -> "LossScaler":
        return cls(loss_scale=fp16.loss_scale, initial_scale_power=fp16.initial_scale_power,
                   loss_scale_window=fp16.loss_scale_window, hysteresis=fp16.hysteresis,
                   consecutive_hysteresis=fp16.consecutive_hysteresis,
                   min_loss_scale=fp16.min_loss_scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        if not self.dynamic:
            return
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                new = max(self.cur_scale / 2, self.min_scale)
                if new == self.cur_scale:
                    logger.warning("fp16 loss scale is at its minimum (%s) and gradients still "
                                   "overflow", self.min_scale)
                self.cur_scale = new
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= 2
        self.cur_iter += 1

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("dynamic", "cur_scale", "scale_window",
                                               "delayed_shift", "cur_hysteresis",
                                               "consecutive_hysteresis", "min_scale",
                                               "cur_iter", "last_overflow_iter")}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


class AmpGradScaler:
    """torch.amp.GradScaler's dynamic scale, for DeepSpeed's torch_autocast in fp16
    (zerolite/autocast.py, [Note: torch_autocast] says where the engine unscales): starts at
    2**16, halves on a step whose gradients are not finite, doubles after `growth_interval`
    finite ones in a row. Not saved in checkpoints (DeepSpeed does not save it either)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.growth_tracker = 0

    @property
    def loss_scale(self) -> float:
        return self.scale

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            grown = self.scale * self.growth_factor
            if grown != float("inf"):
                self.scale = grown
            self.growth_tracker = 0
