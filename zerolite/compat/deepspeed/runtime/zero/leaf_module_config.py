"""`deepspeed.runtime.zero.leaf_module_config`: `zero_optimization.leaf_module`, the modules
marked as ZeRO-3 leaves when the engine is built (by class, by name, by name suffix)."""
from __future__ import annotations

from zerolite.compat.deepspeed.runtime.config_utils import DeepSpeedConfigModel, Factory
from zerolite.config.zero_blocks import DEFAULT_LEAF_MODULE_CLASSES, leaf_module_lists

DEFAULT_LEAF_MODULE_NAMES: list[str] = []
DEFAULT_LEAF_MODULE_NAME_SUFFIXES: list[str] = []


class DeepSpeedZeroLeafModuleConfig(DeepSpeedConfigModel):
    FIELDS = {"classes": Factory(lambda: list(DEFAULT_LEAF_MODULE_CLASSES)),
              "names": Factory(list), "name_suffixes": Factory(list)}

    @classmethod
    def _validate(cls, data: dict) -> dict:
        values = super()._validate(data)
        values.update(leaf_module_lists("zero_optimization.leaf_module", values))
        return values


__all__ = ["DeepSpeedZeroLeafModuleConfig", "DEFAULT_LEAF_MODULE_CLASSES",
           "DEFAULT_LEAF_MODULE_NAMES", "DEFAULT_LEAF_MODULE_NAME_SUFFIXES"]
