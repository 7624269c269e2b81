"""`deepspeed.utils`: the logger, log_dist, groups, set_z3_leaf_modules, zero_to_fp32."""
from __future__ import annotations

import logging

import torch.distributed as dist

from zerolite.compat.deepspeed.utils import groups, zero_to_fp32  # noqa: F401

logger = logging.getLogger("zerolite")
"""DeepSpeed's `logger`; here zerolite's, so `ds_logger.setLevel(...)` (HF Trainer does) sets
the level of what zerolite logs."""


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Log `message` on the given ranks (None: rank 0; [-1]: every rank), as DeepSpeed does."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    ranks = [0] if ranks is None else list(ranks)
    if -1 in ranks or rank in ranks:
        logger.log(level, "[Rank %d] %s", rank, message)


def set_z3_leaf_modules(model, leaf_module_classes):
    """Mark modules of these classes (or class names) as ZeRO-3 leaves; returns them.

    [Note: already true] DeepSpeed gathers a leaf module's whole subtree at once instead of
    per sub-module (for MoE experts). zerolite gathers whole units, so a module inside one unit
    is always gathered whole; the mark is kept for `get_z3_leaf_modules`."""
    names = {c if isinstance(c, str) else c.__name__ for c in leaf_module_classes}
    found = [m for m in model.modules() if type(m).__name__ in names]
    if not found:
        raise ValueError(f"set_z3_leaf_modules: no module of class {sorted(names)} in "
                         f"{type(model).__name__}")
    for m in found:
        m._z3_leaf = True
    return found


def unset_z3_leaf_modules(model, leaf_module_classes):
    names = {c if isinstance(c, str) else c.__name__ for c in leaf_module_classes}
    found = [m for m in model.modules() if type(m).__name__ in names]
    for m in found:
        m._z3_leaf = False
    return found


def get_z3_leaf_modules(model) -> list:
    return [m for m in model.modules() if getattr(m, "_z3_leaf", False)]


def z3_leaf_module(module) -> bool:
    return getattr(module, "_z3_leaf", False)


__all__ = ["logger", "log_dist", "groups", "zero_to_fp32", "set_z3_leaf_modules",
           "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module"]
