"""The rest of DeepSpeedEngine's public surface that scripts, Transformers, Accelerate and
Lightning read, as a mixin of ZeroEngine (kept out of engine.py so the training loop stays
small). Every accessor answers from the engine's own state; none is a constant stand-in."""
from __future__ import annotations

import os
from collections.abc import Mapping


from zerolite.errors import ZeroliteConfigError


class ConfigView(Mapping):
    """`engine.config`: the resolved DeepSpeed config as a mapping (DeepSpeed's engine.config
    is the JSON dict; Transformers calls `engine.config.get("zero_optimization", {})`), whose
    attributes are the typed ZeroConfig's (`engine.config.zero_optimization.stage`)."""

    def __init__(self, config):
        self._cfg = config

    def __getattr__(self, name):
        cfg = self.__dict__.get("_cfg")
        if cfg is None:
            raise AttributeError(name)
        return getattr(cfg, name)

    def __getitem__(self, key):
        return self._cfg.to_dict()[key]

    def __iter__(self):
        return iter(self._cfg.to_dict())

    def __len__(self) -> int:
        return len(self._cfg.to_dict())

    def __repr__(self) -> str:
        return f"ConfigView({self._cfg.to_dict()!r})"


class DeepSpeedAccessors:
    """Mixed into ZeroEngine; relies on its `_config`, `rank` and `world_size` (`device` is the
    engine's own attribute)."""

    # -- who and where ----------------------------------------------------------------
    @property
    def config(self) -> ConfigView:
        return ConfigView(self._config)

    @property
    def zerolite_config(self):
        """The typed, validated config (zerolite.config.ZeroliteConfig) the engine runs on."""
        return self._config

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (torchrun's LOCAL_RANK), as DeepSpeed reads it."""
        return int(os.environ.get("LOCAL_RANK", self.rank))

    @property
    def global_rank(self) -> int:
        return self.rank

    @property
    def dp_world_size(self) -> int:
        """Data-parallel ranks: all of them (zerolite has no model or pipeline parallelism)."""
        return self.world_size

    @property
    def mp_world_size(self) -> int:
        return 1

    @property
    def mpu(self):
        return None

    def get_batch_info(self) -> tuple[int, int, int]:
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        c = self._config
        return c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps

    # -- batch size -------------------------------------------------------------------
    def set_train_batch_size(self, train_batch_size: int) -> None:
        """Change the global batch by changing gradient accumulation (the micro-batch stays),
        as DeepSpeed does."""
        micro = self._config.train_micro_batch_size_per_gpu
        per_step = micro * self.dp_world_size
        if not isinstance(train_batch_size, int) or train_batch_size <= 0 or \
                train_batch_size % per_step:
            raise ZeroliteConfigError(
                f"set_train_batch_size({train_batch_size!r}): must be a positive multiple of "
                f"train_micro_batch_size_per_gpu ({micro}) x data-parallel ranks "
                f"({self.dp_world_size}) = {per_step}")
        self._config.gradient_accumulation_steps = train_batch_size // per_step
        self._config.train_batch_size = train_batch_size

    def set_train_micro_batch_size(self, micro_batch_size: int) -> None:
        """Change the micro-batch; the global batch follows (accumulation stays)."""
        if not isinstance(micro_batch_size, int) or micro_batch_size <= 0:
            raise ZeroliteConfigError(f"set_train_micro_batch_size({micro_batch_size!r}): "
                                      "must be a positive integer")
        self._config.train_micro_batch_size_per_gpu = micro_batch_size
        self._config.train_batch_size = (micro_batch_size * self.dp_world_size
                                         * self._config.gradient_accumulation_steps)

    # -- config questions DeepSpeed answers with methods --------------------------------
    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self._config.zero_optimization.stage

    def fp16_enabled(self) -> bool:
        return self._config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self._config.bf16.enabled

    def zero_optimization(self) -> bool:
        return self._config.zero_optimization.stage > 0

    def zero_optimization_partition_gradients(self) -> bool:
        return self._config.zero_optimization.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self._config.zero_optimization.stage >= 3

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return bool(self._config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def gradient_clipping(self) -> float:
        return self._config.gradient_clipping

    def steps_per_print(self) -> int:
        return self._config.steps_per_print

    def wall_clock_breakdown(self) -> bool:
        return self._config.wall_clock_breakdown

    def communication_data_type(self):
        return self._config.communication_data_type

    def _offload_device(self, key: str) -> str:
        block = getattr(self._config.zero_optimization, key)
        return block.device if block else "none"

    def zero_cpu_offload(self) -> bool:
        """As DeepSpeed: True only for offload_optimizer.device 'cpu'."""
        return self._offload_device("offload_optimizer") == "cpu"

    def zero_use_cpu_optimizer(self) -> bool:
        """As DeepSpeed: the step runs on the host (offload_optimizer 'cpu' or 'nvme')."""
        return self._offload_device("offload_optimizer") in ("cpu", "nvme")

    def zero_partial_offload(self) -> float:
        block = self._config.zero_optimization.offload_optimizer
        return block.ratio if block else 1.0

    def zero_offload_optimizer(self):
        return self._config.zero_optimization.offload_optimizer

    def zero_offload_param(self):
        return self._config.zero_optimization.offload_param

    # -- checkpoints -------------------------------------------------------------------
    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """The full 16-bit state dict on every rank (collective), as Transformers' and
        Accelerate's save_model read it."""
        from zerolite.checkpoint import consolidated_16bit_state_dict

        return consolidated_16bit_state_dict(self, exclude_frozen_parameters)

    # -- lifecycle ----------------------------------------------------------------------
    def empty_partition_cache(self) -> None:
        """Free the full-size buffers held between uses: gathered units that can be released
        and the buffer pool's spare buffers (they come back on the next use). Between steps,
        not inside a forward or backward."""
        import gc

        import torch

        self.sharded.empty_cache()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def destroy(self) -> None:
        """Accelerate's free_memory calls this. zerolite's engine holds no process groups or
        background threads of its own; its buffers go with the engine object."""
