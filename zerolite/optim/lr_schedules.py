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
  * ``WarmupLR``'s ``warmup_max_lr`` defaults to each param group's own lr (docs: 0.001);
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
    (reproduced). DeepSpeed only cycles Adam-style ``betas`` and switches cycling off, with a
    warning, for an optimizer without ``betas`` in its defaults (SGD keeps its momentum):
    reproduced, so an SGD program trains as under DeepSpeed. Stair counts follow the current
    code (older releases ignored them).
  * An unknown ``warmup_type`` is an error here; DeepSpeed logs a warning and uses "log".

Layout: schedule_base.py (stepping and state), warmup_schedules.py, cycle_schedules.py; this
module is the public face and the builders. Parameter rules: `zerolite.config.optim`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from zerolite.config.optim import check_scheduler_keys
from zerolite.errors import ZeroliteConfigError
from zerolite.optim.cycle_schedules import LRRangeTest, OneCycle
from zerolite.optim.warmup_schedules import WarmupCosineLR, WarmupDecayLR, WarmupLR

__all__ = [
    "SCHEDULER_TYPES",
    "WARMUP_TYPES",
    "WarmupLR",
    "WarmupDecayLR",
    "WarmupCosineLR",
    "OneCycle",
    "LRRangeTest",
    "build_lr_scheduler",
    "build_lr_scheduler_from_config",
]

SCHEDULER_TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
WARMUP_TYPES = ("log", "linear")

_CLASSES = {
    "WarmupLR": WarmupLR,
    "WarmupDecayLR": WarmupDecayLR,
    "WarmupCosineLR": WarmupCosineLR,
    "OneCycle": OneCycle,
    "LRRangeTest": LRRangeTest,
}


def build_lr_scheduler(optimizer: Any, type_name: str, params: Optional[Dict[str, Any]] = None):
    """Build the schedule a DeepSpeed ``"scheduler": {"type": ..., "params": {...}}`` describes
    (raw values: the schedule checks them by the config's rules)."""
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
    check_scheduler_keys(type_name, params)
    return cls(optimizer, **params)


def build_lr_scheduler_from_config(optimizer: Any, scheduler):
    """Build from a validated `zerolite.config.SchedulerConfig` (what the engine does): the
    config already checked every parameter and filled DeepSpeed's defaults in."""
    return _CLASSES[scheduler.type].from_config(optimizer, scheduler.params)
