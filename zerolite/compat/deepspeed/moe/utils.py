"""`deepspeed.moe.utils` for models without MoE parameters."""
from __future__ import annotations

from zerolite.compat.deepspeed._refused import DeepSpeedFeatureNotSupported, message


def is_moe_param(param) -> bool:
    """DeepSpeed marks expert parameters with `allreduce = False`."""
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=178956971):
    """Param groups as a list; MoE parameters would get their own groups, but zerolite has no
    MoE, so a group holding one is refused and other groups come back unchanged."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError("split_params_into_different_moe_groups_for_optimizer: expected a dict "
                         f"or a list/tuple of dicts, got {type(param_groups).__name__}")
    for i, group in enumerate(param_groups):
        if any(is_moe_param(p) for p in group["params"]):
            raise DeepSpeedFeatureNotSupported(message(
                f"split_params_into_different_moe_groups_for_optimizer (group {i})",
                "expert (MoE) parameters"))
    return param_groups
