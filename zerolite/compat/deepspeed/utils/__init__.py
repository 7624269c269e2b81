"""`deepspeed.utils`: the logger, log_dist, groups, set_z3_leaf_modules, zero_to_fp32 and the
tensor-fragment API (safe_get_full_fp32_param, ...)."""
from __future__ import annotations

from zerolite.compat.deepspeed.utils import groups, logging, tensor_fragment, zero_to_fp32  # noqa: F401
from zerolite.compat.deepspeed.utils.logging import log_dist, logger  # noqa: F401
from zerolite.compat.deepspeed.utils.tensor_fragment import (  # noqa: F401
    safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
    safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
    safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
    safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized,
)


def set_z3_leaf_modules(model, leaf_module_classes):
    """Mark modules of these classes (or class names) as ZeRO-3 leaves; returns them.

    [Note: mark only] DeepSpeed gathers a leaf module's whole subtree at once instead of per
    sub-module (for MoE experts). zerolite gathers whole units, so a leaf inside one unit is
    gathered whole already; a leaf spanning several units is still gathered unit by unit (pass
    its class in the `zerolite.unit_policy` config key to make it one unit)."""
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


__all__ = ["logger", "log_dist", "logging", "groups", "zero_to_fp32", "set_z3_leaf_modules",
           "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module", "tensor_fragment",
           *tensor_fragment.__all__]
