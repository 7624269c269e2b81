"""`deepspeed.runtime.config`: DeepSpeedConfig (a whole config, parsed and checked for a world
size), DeepSpeedConfigError and the optimizer-name constants.

DeepSpeedConfig is a view of zerolite's own ZeroConfig (zerolite/config/) under DeepSpeed's
attribute names, so the two accept and refuse the same configs. DeepSpeedConfigError IS
zerolite's ZeroliteConfigError: `except DeepSpeedConfigError` catches every config error
zerolite raises, from here or from initialize()."""
from __future__ import annotations

import types
from dataclasses import asdict

import torch
import torch.distributed as dist

from zerolite.compat.deepspeed.runtime.zero.config import DeepSpeedZeroConfig, get_zero_config
from zerolite.config.core import ZeroConfig, read_config_source
from zerolite.errors import ZeroliteConfigError as DeepSpeedConfigError

ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = [ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER,
                        MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER, LION_OPTIMIZER,
                        MUON_OPTIMIZER]
"""DeepSpeed's optimizer names (lower case); which ones zerolite builds: zerolite/config/optim.py."""
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"
ADAM_W_MODE_DEFAULT = True

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _world(mpu, config: dict) -> tuple[int, int]:
    """(rank, data-parallel world size) as DeepSpeed derives them; 1 process without a group."""
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    if mpu is not None and hasattr(mpu, "get_data_parallel_world_size"):
        return dist.get_rank(), mpu.get_data_parallel_world_size()
    return dist.get_rank(), dist.get_world_size() // config.get("sequence_parallel_size", 1)


class DeepSpeedConfig:
    """`DeepSpeedConfig(config, mpu=None, mesh_device=None)`: `config` is a dict, a JSON/Hjson
    file path or base64 JSON. The batch triangle is completed for the data-parallel world
    size (torch.distributed's, or 1 before it is initialised)."""

    def __init__(self, config, mpu=None, mesh_device=None):
        if mesh_device is not None:
            raise DeepSpeedConfigError("DeepSpeedConfig(mesh_device=...): zerolite has data "
                                       "parallelism only; pass no mesh")
        self._param_dict = read_config_source(config)
        self.global_rank, self.world_size = _world(mpu, self._param_dict)
        cfg = ZeroConfig.from_dict(self._param_dict, self.world_size)
        self.zerolite_config = cfg
        """The same config as zerolite's ZeroConfig (what the engine reads)."""
        self.train_batch_size = cfg.train_batch_size
        self.train_micro_batch_size_per_gpu = cfg.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self.steps_per_print = cfg.steps_per_print
        self.gradient_clipping = cfg.gradient_clipping
        self.prescale_gradients = cfg.prescale_gradients
        self.gradient_predivide_factor = cfg.gradient_predivide_factor
        self.communication_data_type = _DTYPES.get(cfg.communication_data_type)
        self.wall_clock_breakdown = cfg.wall_clock_breakdown
        self.dataloader_drop_last = cfg.dataloader_drop_last
        self.zero_config: DeepSpeedZeroConfig = get_zero_config(self._param_dict)
        self.zero_optimization_stage = self.zero_config.stage
        self.zero_enabled = self.zero_optimization_stage > 0
        self.float16_config = types.SimpleNamespace(**asdict(cfg.fp16))
        self.bfloat16_config = types.SimpleNamespace(**asdict(cfg.bf16))
        opt = self._param_dict.get("optimizer") or {}
        name = opt.get("type")
        self.optimizer_name = name.lower() if isinstance(name, str) and \
            name.lower() in DEEPSPEED_OPTIMIZERS else name
        self.optimizer_params = opt.get("params")
        sched = self._param_dict.get("scheduler") or {}
        self.scheduler_name = sched.get("type")
        self.scheduler_params = sched.get("params")
        self.zero_allow_untested_optimizer = self._param_dict.get(
            "zero_allow_untested_optimizer", False)
        self.checkpoint_tag_validation_enabled = cfg.checkpoint_tag_validation != "IGNORE"
        self.checkpoint_tag_validation_fail = cfg.checkpoint_tag_validation == "FAIL"

    @property
    def fp16_enabled(self) -> bool:
        return self.float16_config.enabled

    @property
    def bfloat16_enabled(self) -> bool:
        return self.bfloat16_config.enabled

    def print(self, name: str) -> None:
        from zerolite.compat.deepspeed.utils.logging import logger

        logger.info("%s:", name)
        for key in sorted(vars(self)):
            if key not in ("_param_dict", "zerolite_config"):
                logger.info("  %s %s %s", key, "." * (29 - len(key)), getattr(self, key))


__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError", "DEEPSPEED_OPTIMIZERS", "ADAGRAD_OPTIMIZER",
           "ADAM_OPTIMIZER", "ADAMW_OPTIMIZER", "LAMB_OPTIMIZER", "MUADAM_OPTIMIZER",
           "MUADAMW_OPTIMIZER", "MUSGD_OPTIMIZER", "LION_OPTIMIZER", "MUON_OPTIMIZER",
           "TORCH_ADAM_PARAM", "ADAM_W_MODE", "ADAM_W_MODE_DEFAULT"]
