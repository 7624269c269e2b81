"""`deepspeed.runtime.zero.offload_config`: the offload blocks of `zero_optimization` as
DeepSpeed's config objects (validated by zerolite's own parser, zerolite/config/sections.py)."""
from __future__ import annotations

from enum import Enum
from pathlib import Path

from zerolite.compat.deepspeed.runtime.config_utils import DeepSpeedConfigModel
from zerolite.config.zero_blocks import parse_offload


class OffloadDeviceEnum(str, Enum):
    """Where offloaded tensors live."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """DeepSpeed's kinds of engine buffers (engine.offload_states, not supported by zerolite)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


class _OffloadConfig(DeepSpeedConfigModel):
    _KEY = ""

    @classmethod
    def _validate(cls, data: dict) -> dict:
        values = super()._validate(data)
        parse_offload(f"zero_optimization.{cls._KEY}", cls._KEY, data)  # raises naming the key
        values["device"] = OffloadDeviceEnum(values["device"]).value
        if values["nvme_path"] is not None:
            values["nvme_path"] = Path(values["nvme_path"])
        return values


class DeepSpeedZeroOffloadParamConfig(_OffloadConfig):
    """`zero_optimization.offload_param` (stage 3)."""

    _KEY = "offload_param"
    FIELDS = {"device": "none", "nvme_path": None, "buffer_count": 5,
              "buffer_size": 100_000_000, "max_in_cpu": 1_000_000_000, "pin_memory": True}


class DeepSpeedZeroOffloadOptimizerConfig(_OffloadConfig):
    """`zero_optimization.offload_optimizer` (stages 1-3)."""

    _KEY = "offload_optimizer"
    FIELDS = {"device": "none", "nvme_path": None, "buffer_count": 4, "pin_memory": True,
              "pipeline_read": False, "pipeline_write": False, "fast_init": False,
              "ratio": 1.0, "super_offload": False, "cpuadam_cores_perc": 0.8}

    @property
    def pipeline(self) -> bool:
        return self.pipeline_read or self.pipeline_write


__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum", "DeepSpeedZeroOffloadParamConfig",
           "DeepSpeedZeroOffloadOptimizerConfig"]
