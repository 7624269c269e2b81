"""The rest of DeepSpeedEngine's public surface that scripts, Transformers, Accelerate and
Lightning read, as a mixin of ZeroEngine (kept out of engine.py so the training loop stays
small). Every accessor answers from the engine's own state or its resolved config (as
DeepSpeed's does, also for keys zerolite accepts without acting on them); none is a constant
stand-in. Queries about features zerolite does not build (the flops profiler, the autotuner,
data efficiency, deepcompile) answer False; whatever would use such a feature
is in REFUSED and raises DeepSpeedFeatureNotSupported naming it. docs/deepspeed_api.md
classifies every public name of DeepSpeedEngine (tools/deepspeed_inventory.py)."""
from __future__ import annotations

import gc
import os
from collections.abc import Mapping

import torch
import torch.distributed as dist

from zerolite.autocast import default_safe_module_names
from zerolite.errors import (
    DeepSpeedFeatureNotSupported, ZeroliteConfigError, not_supported_message,
)

_DATA_EFFICIENCY = ("DeepSpeed's data-efficiency library: curriculum learning, data sampling, "
                    "random-LTD")
_AUTOTUNER = "the autotuner"
_COMPILE = "DeepCompile and its compile passes (engine.compile runs torch.compile without them)"
_FLOPS = "the flops profiler"
_TP = "tensor parallelism"
_MOVE_STATES = ("moving the engine's states off the device between steps; "
                "zero_optimization.offload_optimizer / offload_param keep them on the host")

REFUSED: dict[str, str] = {
    "allreduce_gradients": "a manual gradient all-reduce: zerolite reduces gradients itself, in "
                           "backward or at the step",
    "autotp_size": _TP,
    "tensor_parallel_config": _TP,
    "coalesce_grad_reduction": "coalescing the reductions of several backwards; zerolite's "
                               "config has \"zerolite\": {\"reduce_once_per_step\": true}",
    "get_sequence_parallel_group": "sequence parallelism",
    "get_wall_clock_timers": "DeepSpeed's engine timers; zerolite's timings are "
                             "engine.last_step_stats",
    "load_moe_state_dict": "mixture of experts",
    "load_universal_checkpoint": "DeepSpeed universal checkpoints; zerolite's own checkpoints "
                                 "reshard on load",
    "offload_states": _MOVE_STATES,
    "reload_states": _MOVE_STATES,
    "use_node_local_storage": "node-local checkpoint storage",
    "zenflow_config": "ZenFlow, selective and stalled optimizer updates",
    "zero_save_muon_momentum_buffer_in_memory": "the Muon optimizer",
    **{name: _AUTOTUNER for name in (
        "autotuning_end_profile_step", "autotuning_metric", "autotuning_metric_path",
        "autotuning_model_info_path", "autotuning_start_profile_step")},
    **{name: _COMPILE for name in (
        "get_autosp_backend", "get_autotp_backend", "get_compile_time",
        "get_deepcompile_backend", "get_deepspeed_compile_backend", "register_compile_pass")},
    **{name: _DATA_EFFICIENCY for name in (
        "curriculum_learning_config", "data_efficiency_config", "data_sampling_config",
        "random_ltd_config", "random_ltd_initialize", "set_custom_curriculum_learning_schedule",
        "set_data_post_process_func")},
    **{name: _FLOPS for name in (
        "flops_profiler_detailed", "flops_profiler_module_depth", "flops_profiler_output_file",
        "flops_profiler_profile_step", "flops_profiler_recompute_fwd_factor",
        "flops_profiler_top_modules")},
}
"""DeepSpeedEngine methods zerolite refuses -> why. Each is a method of the engine that raises
DeepSpeedFeatureNotSupported naming it (whatever the arguments), so a program fails where it
uses the feature, not with an AttributeError about the model."""

_OPTIMIZERS_LOWERCASED = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd",
                          "lion", "muon")
"""optimizer.type values DeepSpeed's config lower-cases (its own optimizers); any other type
name (e.g. "SGD") is reported as written."""

_EVAL_ROUTES = ("eval", "predict")
"""deepspeed_io routes whose default sampler does not shuffle."""


def _refused_method(name: str, why: str):
    def refused(*_args, **_kwargs):
        raise DeepSpeedFeatureNotSupported(not_supported_message(f"DeepSpeedEngine.{name}", why))

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Refused: {why}."
    return refused


RefusedEngineMethods = type("RefusedEngineMethods", (), {
    "__doc__": "The REFUSED methods, as a base of DeepSpeedAccessors (ahead of nn.Module, so "
               "DeepSpeed's names shadow torch's where they collide).",
    **{name: _refused_method(name, why) for name, why in REFUSED.items()}})


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


class DeepSpeedAccessors(RefusedEngineMethods):
    """Mixed into ZeroEngine; relies on its `_config`, `rank`, `world_size`, `module`,
    `optimizer`, `sharded`, `device` and `_initialize_args` (what
    initialize was given, as DeepSpeed keeps it)."""

    has_moe_layers = False
    """deepspeed.moe's MoE layer is refused, so no model zerolite trains holds one."""
    pipeline_parallelism = False
    """DeepSpeed's: the model is a PipelineModule (refused here)."""
    dont_change_device = False
    """DeepSpeed's: initialize leaves the model where it is; never set by deepspeed.initialize,
    and zerolite too places the model on the engine's device."""
    losses = None
    """DeepSpeedEngine only resets it to None (at start and every step); the pipeline engine
    fills it."""

    # -- what initialize was given ------------------------------------------------------
    @property
    def client_optimizer(self):
        """The optimizer (or optimizer callable) passed to initialize, or None."""
        return self._initialize_args["optimizer"]

    @property
    def client_lr_scheduler(self):
        """The lr scheduler (or scheduler callable) passed to initialize, or None."""
        return self._initialize_args["lr_scheduler"]

    @property
    def training_data(self):
        return self._initialize_args["training_data"]

    @property
    def collate_fn(self):
        """initialize's collate_fn; deepspeed_io's default."""
        return self._initialize_args["collate_fn"]

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

    @property
    def data_parallel_group(self):
        """The default group: every rank is a data-parallel rank, and zerolite's gradient
        reductions run over all of them."""
        return dist.group.WORLD

    @property
    def seq_data_parallel_group(self):
        """Without sequence parallelism, DeepSpeed's data-parallel group."""
        return self.data_parallel_group

    @property
    def seq_dp_world_size(self) -> int:
        return self.dp_world_size

    @property
    def sequence_parallel_size(self) -> int:
        """1: zerolite has no sequence parallelism."""
        return 1

    @property
    def dist_backend(self) -> str:
        """The backend of the process group the engine runs on (gloo, nccl)."""
        return dist.get_backend()

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(group=self.data_parallel_group)

    def get_model_parallel_rank(self) -> int:
        """0, the only rank of a model-parallel group of one. (DeepSpeed asserts here unless
        tensor-parallel groups were set up.)"""
        return 0

    def get_tensor_parallel_rank(self) -> int:
        """0, as get_model_parallel_rank."""
        return 0

    @property
    def param_names(self) -> dict:
        """{parameter: name} of the model's parameters (DeepSpeed's, for checkpoint files)."""
        return {p: name for name, p in self.module.named_parameters()}

    @property
    def inside_no_sync_ctxt(self) -> bool:
        """Inside engine.no_sync(): backwards keep their gradients unreduced."""
        return not self.sharded.grad_sync.requires_sync

    @property
    def enable_backward_allreduce(self) -> bool:
        """True: zerolite always reduces gradients itself. Setting it False (DeepSpeed's way
        for a program to do its own all-reduce) is refused."""
        return True

    @enable_backward_allreduce.setter
    def enable_backward_allreduce(self, value: bool) -> None:
        if not value:
            raise DeepSpeedFeatureNotSupported(not_supported_message(
                "DeepSpeedEngine.enable_backward_allreduce = False",
                "turning off the engine's gradient reduction"))

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

    @property
    def communication_data_type(self) -> torch.dtype:
        """The dtype gradients are reduced in: communication_data_type's, else the training
        dtype (as DeepSpeed's)."""
        return self._config.communication_torch_dtype

    @communication_data_type.setter
    def communication_data_type(self, value) -> None:
        raise DeepSpeedFeatureNotSupported(not_supported_message(
            "DeepSpeedEngine.communication_data_type = ...", "changing the reduction dtype "
            "after initialize; set communication_data_type in the config"))

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

    def zero_reduce_scatter(self) -> bool:
        return self._config.zero_optimization.reduce_scatter

    def zero_overlap_comm(self) -> bool:
        """As configured (default: True at stage 3); zerolite always overlaps reductions with
        backward."""
        return self._config.zero_optimization.overlap_comm

    def zero_sub_group_size(self) -> int:
        return self._config.zero_optimization.sub_group_size

    def zero_reduce_bucket_size(self) -> int:
        return self._config.zero_optimization.reduce_bucket_size

    def zero_multi_rank_bucket_allreduce(self) -> bool:
        return self._config.zero_optimization.use_multi_rank_bucket_allreduce

    def zero_allgather_bucket_size(self) -> int:
        return self._config.zero_optimization.allgather_bucket_size

    def zero_allgather_partitions(self) -> bool:
        return self._config.zero_optimization.allgather_partitions

    def zero_contiguous_gradients(self) -> bool:
        return self._config.zero_optimization.contiguous_gradients

    def zero_load_from_fp32_weights(self) -> bool:
        return self._config.zero_optimization.load_from_fp32_weights

    def zero_elastic_checkpoint(self) -> bool:
        return self._config.zero_optimization.elastic_checkpoint

    def zero_max_live_parameters(self) -> int:
        return self._config.zero_optimization.stage3_max_live_parameters

    def zero_max_reuse_distance(self) -> int:
        return self._config.zero_optimization.stage3_max_reuse_distance

    def zero_prefetch_bucket_size(self) -> int:
        return self._config.zero_optimization.stage3_prefetch_bucket_size

    def zero_param_persistence_threshold(self) -> int:
        return self._config.zero_optimization.stage3_param_persistence_threshold

    def zero_model_persistence_threshold(self) -> int:
        return self._config.zero_optimization.stage3_model_persistence_threshold

    def zero_module_granularity_threshold(self) -> int:
        return self._config.zero_optimization.module_granularity_threshold

    def zero_legacy_stage1(self) -> bool:
        return self._config.zero_optimization.legacy_stage1

    def zero_ignore_unused_parameters(self) -> bool:
        return self._config.zero_optimization.ignore_unused_parameters

    def zero_round_robin_gradients(self) -> bool:
        return self._config.zero_optimization.round_robin_gradients

    def zero_hpz_partition_size(self) -> int:
        return self._config.zero_optimization.zero_hpz_partition_size

    def zero_quantized_weights(self) -> bool:
        return self._config.zero_optimization.zero_quantized_weights

    def zero_quantized_nontrainable_weights(self) -> bool:
        return self._config.zero_optimization.zero_quantized_nontrainable_weights

    def zero_quantized_gradients(self) -> bool:
        return self._config.zero_optimization.zero_quantized_gradients

    def zero_log_trace_cache_warnings(self) -> bool:
        return self._config.zero_optimization.log_trace_cache_warnings

    def zero_compute_grad_norm(self) -> bool:
        """True: zerolite computes the global gradient norm every step (get_global_grad_norm);
        DeepSpeed's compute_grad_norm=false is not read."""
        return True

    def zero_nvme_offload_optimizer(self) -> bool:
        return self._offload_device("offload_optimizer") == "nvme"

    def super_offload(self) -> bool:
        return getattr(self._config.zero_optimization.offload_optimizer, "super_offload", False)

    def cpuadam_cores_perc(self) -> float:
        """offload_optimizer.cpuadam_cores_perc; 0.9 without offload_optimizer, as DeepSpeed."""
        return getattr(self._config.zero_optimization.offload_optimizer, "cpuadam_cores_perc",
                       0.9)

    def is_first_weights_partition_group(self) -> bool:
        return self.zero_optimization_partition_weights()

    def zero_allow_untested_optimizer(self) -> bool:
        return self._config.zero_allow_untested_optimizer

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return self._config.zero_force_ds_cpu_optimizer

    # -- optimizer and scheduler as configured ---------------------------------------------
    def _raw(self, *path: str, default=None):
        """A key of the config as given, for keys DeepSpeed reads raw and zerolite accepts
        without typing them; `default` is DeepSpeed's."""
        node = self._config.raw
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                return default
            node = node[key]
        return node

    @staticmethod
    def _given_params(raw_block, typed_block):
        """A config block's "params" as given, "auto" values as zerolite resolved them (left
        out where it dropped them)."""
        if not isinstance(raw_block, Mapping) or "params" not in raw_block:
            return None
        resolved = typed_block.params if typed_block is not None else {}
        out = {}
        for key, value in raw_block["params"].items():
            if not (isinstance(value, str) and value.strip().lower() == "auto"):
                out[key] = value
            elif key in resolved:
                out[key] = resolved[key]
        return out

    def optimizer_name(self) -> str | None:
        """The client optimizer's class name, else optimizer.type as DeepSpeed reports it
        (its own optimizers lower-cased), else None."""
        if self.client_optimizer:
            return type(self.client_optimizer).__name__
        name = self._raw("optimizer", "type")
        if isinstance(name, str) and name.lower() in _OPTIMIZERS_LOWERCASED:
            return name.lower()
        return name

    def optimizer_params(self) -> dict | None:
        return self._given_params(self._raw("optimizer"), self._config.optimizer)

    def optimizer_legacy_fusion(self) -> bool:
        return self._raw("optimizer", "legacy_fusion", default=False)

    def scheduler_name(self) -> str | None:
        return self._raw("scheduler", "type")

    def scheduler_params(self) -> dict | None:
        return self._given_params(self._raw("scheduler"), self._config.scheduler)

    def get_type(self) -> list:
        """Each optimizer param group's "type" (0.0 where it has none), as DeepSpeed."""
        opt = self.basic_optimizer
        return [g.get("type", 0.0) for g in opt.param_groups] if opt is not None else []

    # -- precision ----------------------------------------------------------------------
    def fp16_auto_cast(self) -> bool:
        return self._config.fp16.auto_cast

    def fp16_master_weights_and_gradients(self) -> bool:
        return self._config.fp16.fp16_master_weights_and_grads

    def bf16_master_weights_and_gradients(self) -> bool:
        return self._config.bf16.bf16_master_weights_and_grads

    def bf16_optimizer_states(self) -> bool:
        return self._config.bf16.bf16_optimizer_states

    def loss_scale(self) -> float:
        """fp16.loss_scale as configured (0: dynamic); the scale in use is the engine's
        loss_scaler.loss_scale."""
        return self._config.fp16.loss_scale

    def dynamic_loss_scale(self) -> bool:
        return self._config.fp16.loss_scale == 0

    def initial_dynamic_scale(self) -> int:
        return 2 ** self._config.fp16.initial_scale_power

    def dynamic_loss_scale_args(self) -> dict:
        """The dynamic loss scaler's settings, under DeepSpeed's DynamicLossScaler names."""
        fp16 = self._config.fp16
        return {"init_scale": 2 ** fp16.initial_scale_power,
                "scale_window": fp16.loss_scale_window, "delayed_shift": fp16.hysteresis,
                "consecutive_hysteresis": fp16.consecutive_hysteresis,
                "min_scale": fp16.min_loss_scale}

    def gradient_predivide_factor(self) -> float:
        return self._config.gradient_predivide_factor

    def postscale_gradients(self) -> bool:
        return not self._config.prescale_gradients

    # -- other config questions ---------------------------------------------------------
    def dataloader_drop_last(self) -> bool:
        return self._config.dataloader_drop_last

    def memory_breakdown(self) -> bool:
        return self._raw("memory_breakdown", default=False)

    def dump_state(self) -> bool:
        return self._raw("dump_state", default=False)

    def checkpoint_tag_validation_enabled(self) -> bool:
        return self._config.checkpoint_tag_validation != "IGNORE"

    def checkpoint_tag_validation_fail(self) -> bool:
        return self._config.checkpoint_tag_validation == "FAIL"

    def checkpoint_writer_enabled(self) -> bool:
        """False: zerolite writes its checkpoints itself (no checkpoint.writer engines)."""
        return False

    def managed_gradient_accumulation(self) -> bool:
        """True: the engine counts micro-steps and decides the accumulation boundary."""
        return True

    # -- features zerolite does not build: off ----------------------------------------------
    def flops_profiler_enabled(self) -> bool:
        """False: zerolite has no flops profiler (the flops_profiler block loads, unused)."""
        return False

    def autotuning_enabled(self) -> bool:
        """False: zerolite has no autotuner."""
        return False

    def autotuning_profile_model_info(self) -> bool:
        return False

    def data_efficiency_enabled(self) -> bool:
        """False: zerolite has no data-efficiency library (curriculum, sampling, random-LTD)."""
        return False

    def data_sampling_enabled(self) -> bool:
        return False

    def curriculum_learning_enabled(self) -> bool:
        return False

    def random_ltd_enabled(self) -> bool:
        return False

    def torch_autocast_enabled(self) -> bool:
        return self.torch_autocast.enabled

    def torch_autocast_dtype(self) -> torch.dtype | None:
        """torch_autocast.dtype as a torch dtype (None when the config names none)."""
        return self.torch_autocast.dtype

    def torch_autocast_lower_precision_safe_modules(self) -> list[str]:
        """The configured class names, or DeepSpeed's defaults as "package.Class"."""
        names = self.torch_autocast.module_names
        return list(names) if names is not None else default_safe_module_names()

    def is_deepcompile_enabled(self) -> bool:
        """False: zerolite has no DeepCompile (engine.compile runs plain torch.compile)."""
        return False

    def is_deepcompile_active(self) -> bool:
        return False

    @property
    def is_compiled(self) -> bool:
        return self._compiled

    def compile(self, backend: str = "inductor", compile_kwargs: dict | None = None,
                schedule=None, compiled_autograd_enabled: bool = False) -> None:
        """torch.compile the model's forward, as DeepSpeed's engine.compile does without
        DeepCompile (Accelerate calls it when a dynamo backend is configured). The units'
        gather and release hooks stay eager (zero/hooks.py), so each unit's forward compiles
        between them. Compiling twice is a no-op, as in DeepSpeed."""
        if schedule is not None:
            raise DeepSpeedFeatureNotSupported(not_supported_message(
                "DeepSpeedEngine.compile(schedule=...)", "DeepCompile schedules"))
        if compiled_autograd_enabled:
            raise DeepSpeedFeatureNotSupported(not_supported_message(
                "DeepSpeedEngine.compile(compiled_autograd_enabled=True)",
                "compiled autograd (the backward runs zerolite's gradient hooks eagerly)"))
        if self._compiled:
            return
        self.module.compile(**{**(compile_kwargs or {}), "backend": backend})
        self._compiled = True

    def is_sanity_checks_enabled(self) -> bool:
        """False: zerolite has no ZeRO-3 sanity-check mode (enable_sanity_checks)."""
        return False

    # -- data ---------------------------------------------------------------------------
    @staticmethod
    def is_map_style_dataset(obj) -> bool:
        return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")

    @staticmethod
    def is_iterable_style_dataset(obj) -> bool:
        return isinstance(obj, torch.utils.data.IterableDataset)

    def deepspeed_io(self, dataset, batch_size=None, route="train", pin_memory=True,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """A DataLoader over this rank's part of `dataset`, as DeepSpeed's: micro-batches,
        a DistributedSampler over the data-parallel ranks (shuffled for training, in order for
        the "eval" and "predict" routes), dataloader_drop_last, 2 workers unless told.
        Pinning applies only when the engine is on an accelerator."""
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        if not (self.is_map_style_dataset(dataset) or self.is_iterable_style_dataset(dataset)):
            raise ValueError("Training data must be a torch Dataset")
        if data_sampler is None:
            data_sampler = DistributedSampler(dataset, num_replicas=self.dp_world_size,
                                              rank=self.get_data_parallel_rank(),
                                              shuffle=route not in _EVAL_ROUTES)
        return DataLoader(dataset,
                          batch_size=self.train_micro_batch_size_per_gpu()
                          if batch_size is None else batch_size,
                          sampler=data_sampler,
                          collate_fn=self.collate_fn if collate_fn is None else collate_fn,
                          num_workers=2 if num_local_io_workers is None else num_local_io_workers,
                          pin_memory=pin_memory and self.device.type != "cpu",
                          drop_last=self.dataloader_drop_last())

    # -- checkpoints -------------------------------------------------------------------
    def module_state_dict(self, destination=None, prefix="", keep_vars=False,
                          exclude_frozen_parameters=False):
        """The model's state dict (stages 0-2: every rank holds the full weights). Refused
        under stage 3, where the model holds only this rank's shards: the full weights come
        from `_zero3_consolidated_16bit_state_dict()` or `save_16bit_model`."""
        if self.zero_optimization_partition_weights():
            raise DeepSpeedFeatureNotSupported(not_supported_message(
                "DeepSpeedEngine.module_state_dict", "the model's own state dict under ZeRO "
                "stage 3, where it holds partitions; the full weights are "
                "engine._zero3_consolidated_16bit_state_dict() or save_16bit_model"))
        sd = self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        if exclude_frozen_parameters:
            for name, p in self.module.named_parameters():
                if not p.requires_grad:
                    sd.pop(prefix + name, None)
        return sd

    def load_module_state_dict(self, checkpoint, strict=True, custom_load_fn=None,
                               fetch_z3_params=False, z3_params_to_fetch=None,
                               allowed_missing_keys=None) -> None:
        """Load checkpoint["module"] into the model on every rank (collective): the weights
        are gathered, loaded, and rank 0's values written into what persists (each rank's
        fp32 master and parameter shards), at every stage. Parameters are always gathered
        (fetch_z3_params and z3_params_to_fetch are implied); frozen_param_fragments, when
        present, are loaded too."""
        from zerolite.zero.gathered import GatheredParameters

        state = checkpoint["module"]
        with GatheredParameters(list(self.module.parameters()), modifier_rank=0):
            if custom_load_fn:
                custom_load_fn(src=state, dst=self.module)
            else:
                result = self.module.load_state_dict(
                    state, strict=strict and allowed_missing_keys is None)
                if strict and allowed_missing_keys is not None:
                    missing = set(result.missing_keys) - set(allowed_missing_keys)
                    if missing or result.unexpected_keys:
                        raise RuntimeError(
                            "load_module_state_dict: the checkpoint does not match the model "
                            f"beyond allowed_missing_keys: missing={sorted(missing)}, "
                            f"unexpected={sorted(result.unexpected_keys)}")
            frozen = checkpoint.get("frozen_param_fragments")
            if frozen is not None:
                with torch.no_grad():
                    for name, p in self.module.named_parameters():
                        if not p.requires_grad and name in frozen:
                            p.copy_(frozen[name])

    def save_fp16_model(self, save_dir, save_filename: str = "pytorch_model.bin"):
        """DeepSpeed's old name of save_16bit_model."""
        return self.save_16bit_model(save_dir, save_filename)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """The full 16-bit state dict on every rank (collective), as Transformers' and
        Accelerate's save_model read it."""
        from zerolite.checkpoint import consolidated_16bit_state_dict

        with self._checkpoint_event():
            return consolidated_16bit_state_dict(self, exclude_frozen_parameters)

    # -- lifecycle ----------------------------------------------------------------------
    def empty_partition_cache(self) -> None:
        """Free the full-size buffers held between uses: gathered units that can be released
        and the buffer pool's spare buffers (they come back on the next use). Between steps,
        not inside a forward or backward."""
        self.sharded.empty_cache()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def collect_python_gc(self) -> int:
        """Run Python's cyclic garbage collection now (at a point the program chooses)."""
        return gc.collect()

    def destroy(self) -> None:
        """Accelerate's free_memory calls this. zerolite's engine holds no process groups or
        background threads of its own; its buffers go with the engine object."""
