"""`deepspeed.runtime.zero.config`: DeepSpeedZeroConfig (the `zero_optimization` block as a
config object), ZeroStageEnum, get_zero_config. Values are validated by zerolite's own parser
(zerolite/config/sections.py), so both accept and refuse the same configs."""
from __future__ import annotations

from enum import Enum

from zerolite.compat.deepspeed.runtime.config_utils import DeepSpeedConfigModel
from zerolite.compat.deepspeed.runtime.zero.leaf_module_config import (
    DeepSpeedZeroLeafModuleConfig,
)
from zerolite.compat.deepspeed.runtime.zero.offload_config import (
    DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig,
)
from zerolite.config._util import ParseContext
from zerolite.config.sections import ZeroOptimizationConfig
from zerolite.errors import ZeroliteConfigError

ZERO_OPTIMIZATION = "zero_optimization"


class ZeroStageEnum(int, Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


_SUB = {"offload_param": DeepSpeedZeroOffloadParamConfig,
        "offload_optimizer": DeepSpeedZeroOffloadOptimizerConfig,
        "leaf_module": DeepSpeedZeroLeafModuleConfig}


class DeepSpeedZeroConfig(DeepSpeedConfigModel):
    """Every `zero_optimization` key zerolite knows, by DeepSpeed's field names (aliases such
    as `prefetch_bucket_size` accepted), with the offload blocks and `leaf_module` as config
    objects (an offload block given is an object even with device "none"; absent, None)."""

    FIELDS = {f: getattr(ZeroOptimizationConfig, f, None)
              for f in ZeroOptimizationConfig.__dataclass_fields__}

    @classmethod
    def _validate(cls, data: dict) -> dict:
        ctx = ParseContext()
        plain = {k: (v.model_dump() if isinstance(v, DeepSpeedConfigModel) else v)
                 for k, v in data.items()}
        section = ZeroOptimizationConfig.from_dict(plain, ctx)
        if ctx.unknown:
            raise ZeroliteConfigError(f"DeepSpeedZeroConfig: unknown field(s) {ctx.unknown}")
        values = {f: getattr(section, f) for f in cls.FIELDS}
        for key, kind in _SUB.items():
            given = plain.get(key)
            values[key] = kind(**given) if isinstance(given, dict) else (
                kind() if key == "leaf_module" else None)
        return values


def get_zero_config(param_dict: dict) -> DeepSpeedZeroConfig:
    """The `zero_optimization` block of a whole config (`true`/`false`: stage 1/0)."""
    block = param_dict.get(ZERO_OPTIMIZATION, {})
    if isinstance(block, bool):
        block = {"stage": 1 if block else 0}
    return DeepSpeedZeroConfig(**block)


__all__ = ["DeepSpeedZeroConfig", "ZeroStageEnum", "get_zero_config", "ZERO_OPTIMIZATION"]
