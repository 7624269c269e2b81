"""Typed sections of a DeepSpeed config: fp16, bf16, zero_optimization, activation_checkpointing,
monitors, and zerolite's own ``"zerolite"`` block. Key names and defaults follow DeepSpeed."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._util import (
    ParseContext, Section, check_bool, check_dtype_name, check_float, check_int, check_object,
    check_str, fail, fail_msg, join, logger,
)
from .offload import OffloadOptimizerConfig, OffloadParamConfig
from .zero_blocks import DEFAULT_LEAF_MODULE_CLASSES, parse_leaf_module, parse_offload  # noqa: F401


MASTER_ROUNDINGS = ("stochastic", "kahan", "nearest")
"""zerolite.master_rounding's values (the bf16 master update's rounding)."""


def deepspeed_only(default: Any):
    """A field zerolite parses and validates so DeepSpeed configs load, but does not act on.

    Its key is "accepted-ignored" in KEY_SUPPORT (support.py reads this mark; nothing else
    lists these keys again)."""
    return field(default=default, metadata={"deepspeed_only": True})


def is_deepspeed_only(f) -> bool:
    return bool(f.metadata.get("deepspeed_only"))


@dataclass
class Fp16Config(Section):
    """``fp16``: mixed precision with float16 and (dynamic) loss scaling."""

    _PATH: ClassVar[str] = "fp16"
    _AUTO_DEFAULT: ClassVar[frozenset] = frozenset(
        {"auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
         "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"})

    enabled: bool = False
    """Train with float16 compute weights (fp32 master weights live in the optimizer)."""
    auto_cast: bool = False
    """Cast floating-point inputs of the model to float16."""
    loss_scale: float = 0.0
    """Static loss scale; 0 selects dynamic loss scaling."""
    initial_scale_power: int = 16
    """Dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: int = 1000
    """Steps without overflow before the dynamic scale is raised."""
    hysteresis: int = 2
    """Overflows tolerated before the dynamic scale is lowered."""
    consecutive_hysteresis: bool = False
    """Refill hysteresis after every step without overflow."""
    min_loss_scale: float = 1.0
    """Lower bound of the dynamic loss scale."""
    fp16_master_weights_and_grads: bool = deepspeed_only(False)
    """DeepSpeed's fp16 masters (stage 2 + CPU offload); true is refused (support.py,
    [Note: refused when switched on])."""

    @classmethod
    def _auto_rules(cls, ctx):
        return {"enabled": (False, "fp16 is only enabled when asked for explicitly")}

    def __post_init__(self):
        p = self._PATH
        self.enabled = check_bool(f"{p}.enabled", self.enabled)
        self.auto_cast = check_bool(f"{p}.auto_cast", self.auto_cast)
        self.loss_scale = check_float(f"{p}.loss_scale", self.loss_scale, ge=0)
        self.initial_scale_power = check_int(f"{p}.initial_scale_power", self.initial_scale_power,
                                             ge=0, le=127)
        self.loss_scale_window = check_int(f"{p}.loss_scale_window", self.loss_scale_window, ge=1)
        self.hysteresis = check_int(f"{p}.hysteresis", self.hysteresis, ge=1)
        self.consecutive_hysteresis = check_bool(f"{p}.consecutive_hysteresis",
                                                 self.consecutive_hysteresis)
        self.min_loss_scale = check_float(f"{p}.min_loss_scale", self.min_loss_scale, gt=0)
        self.fp16_master_weights_and_grads = check_bool(f"{p}.fp16_master_weights_and_grads",
                                                        self.fp16_master_weights_and_grads)


@dataclass
class Bf16Config(Section):
    """``bf16`` (legacy name ``bfloat16``): bfloat16 compute with fp32 master weights, or
    (DeepSpeed >= 0.18's keys) bf16 master weights, gradient shards and optimizer states."""

    _PATH: ClassVar[str] = "bf16"
    _EXTRA_KNOWN: ClassVar[frozenset] = frozenset({"immediate_grad_update"})

    enabled: bool = False
    """Train with bfloat16 compute weights."""
    bf16_master_weights_and_grads: bool = False
    """Keep the master weights and the reduced gradient shards in bf16 (2 bytes each instead
    of 4); zero_optimization.stage 1-3. As in DeepSpeed, without bf16_optimizer_states it
    needs offload_optimizer (the fp32 optimizer state then lives in host memory). The
    update rounds as zerolite.master_rounding says."""
    bf16_optimizer_states: bool = False
    """Keep the optimizer states (Adam's exp_avg / exp_avg_sq) in bf16 too; needs
    bf16_master_weights_and_grads."""
    check_grad_overflow: bool = True
    """Skip the optimizer step when the gradient norm is inf or NaN. As in DeepSpeed it
    matters at stages 1-2 only: stage 0 and stage 3 in bf16 always skip such a step
    (engine.py, [Note: non-finite gradients])."""

    @classmethod
    def _auto_rules(cls, ctx):
        return {"enabled": (False, "bf16 is only enabled when asked for explicitly")}

    def __post_init__(self):
        p = self._PATH
        self.enabled = check_bool(f"{p}.enabled", self.enabled)
        self.bf16_master_weights_and_grads = check_bool(f"{p}.bf16_master_weights_and_grads",
                                                        self.bf16_master_weights_and_grads)
        self.bf16_optimizer_states = check_bool(f"{p}.bf16_optimizer_states",
                                                self.bf16_optimizer_states)
        self.check_grad_overflow = check_bool(f"{p}.check_grad_overflow",
                                              self.check_grad_overflow)


@dataclass
class DataTypesConfig(Section):
    """``data_types``: DeepSpeed's per-kind dtypes under fp16/bf16 training."""

    _PATH: ClassVar[str] = "data_types"
    _AUTO_DEFAULT: ClassVar[frozenset] = frozenset({"keep_in_fp32_modules"})

    grad_accum_dtype: str | None = None
    """dtype gradients accumulate in ("fp32", "bf16", "fp16"; null = the training dtype).
    zerolite accumulates in fp32 at stages 1-3 either way; it decides, as in DeepSpeed, which
    optimizer a bf16 stage-1 run gets and so whether a non-finite step is skipped."""
    param_dtype: str | None = None
    """The parameters' dtype; must be the one fp16/bf16 enables (null = that one)."""
    buffer_dtype: str | None = None
    """dtype the model's floating-point buffers are cast to; null keeps each buffer's own
    (DeepSpeed >= 0.19: only parameters take the training dtype)."""
    keep_in_fp32_modules: Any = "auto"
    """Buffers kept in fp32 under fp16/bf16: "auto" = the names the model's
    `_keep_in_fp32_modules_strict` (and, under fp16, `_keep_in_fp32_modules`) list, as
    transformers does; or a list of name patterns (`*` = anything, matched anywhere in the
    buffer's full name); [] keeps none."""

    def __post_init__(self):
        p = self._PATH
        self.grad_accum_dtype = check_dtype_name(f"{p}.grad_accum_dtype", self.grad_accum_dtype)
        self.param_dtype = check_dtype_name(f"{p}.param_dtype", self.param_dtype)
        self.buffer_dtype = check_dtype_name(f"{p}.buffer_dtype", self.buffer_dtype)
        keep = self.keep_in_fp32_modules
        if keep != "auto" and not (isinstance(keep, list)
                                   and all(isinstance(n, str) for n in keep)):
            fail(f"{p}.keep_in_fp32_modules", keep, '"auto" or a list of name patterns')


@dataclass
class TorchAutocastConfig(Section):
    """``torch_autocast``: DeepSpeed's autocast mode. Parameters and masters stay fp32, the
    engine's forward runs under torch.autocast, and at stages 1-3 the gradients of the
    lower-precision-safe modules' parameters are reduced in the autocast dtype (the others in
    fp32); fp16 adds a torch-style GradScaler (zerolite/autocast.py, [Note: torch_autocast])."""

    _PATH: ClassVar[str] = "torch_autocast"

    enabled: bool = False
    """Run the forward under torch.autocast (needs fp16 and bf16 off)."""
    dtype: str | None = None
    """The autocast dtype ("bf16", "fp16"); null = torch's default for the device (bf16 on
    CPU, fp16 on CUDA) for the forward only: gradients are then reduced in fp32 and fp16
    gets no GradScaler, as in DeepSpeed."""
    lower_precision_safe_modules: list | None = None
    """Module classes, as "package.Class" strings, whose parameters' gradients are reduced in
    the autocast dtype (the class itself, not subclasses); null = torch.nn's Linear, Conv1d,
    Conv2d, Conv3d."""

    def __post_init__(self):
        p = self._PATH
        self.enabled = check_bool(f"{p}.enabled", self.enabled)
        self.dtype = check_dtype_name(f"{p}.dtype", self.dtype)
        mods = self.lower_precision_safe_modules
        if mods is not None:
            if not isinstance(mods, (list, tuple)) or not all(
                    isinstance(m, str) and "." in m for m in mods):
                fail(f"{p}.lower_precision_safe_modules", mods,
                     'a list of "package.Class" strings or null')
            self.lower_precision_safe_modules = list(mods)


@dataclass
class ZeroOptimizationConfig(Section):
    """``zero_optimization``: ZeRO partitioning of optimizer state, gradients and parameters.

    Fields made with `deepspeed_only(...)` are validated so DeepSpeed configs load but change
    nothing in zerolite; the others are what ShardingOptions and the engine read.
    """

    _PATH: ClassVar[str] = "zero_optimization"
    _ALIASES: ClassVar[dict] = {
        "prefetch_bucket_size": "stage3_prefetch_bucket_size",
        "param_persistence_threshold": "stage3_param_persistence_threshold",
        "model_persistence_threshold": "stage3_model_persistence_threshold",
        "max_live_parameters": "stage3_max_live_parameters",
        "max_reuse_distance": "stage3_max_reuse_distance",
        "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    }
    _EXTRA_KNOWN: ClassVar[frozenset] = frozenset(
        {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "allgather_size",
         "compute_grad_norm", "allgather_sequential", "parameter_alignment",
         "enable_sanity_checks", "zenflow", "zeropp_loco_param",
         "save_muon_momentum_buffer_in_memory"})
    _AUTO_DEFAULT: ClassVar[frozenset] = frozenset(
        {"contiguous_gradients", "reduce_scatter", "allgather_partitions", "allgather_bucket_size",
         "overlap_comm", "sub_group_size", "stage3_max_live_parameters",
         "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
         "stage3_model_persistence_threshold", "round_robin_gradients"})

    stage: int = 0
    """0 = off, 1 = optimizer state, 2 = + gradients, 3 = + parameters partitioned."""
    contiguous_gradients: bool = deepspeed_only(True)
    """Copy gradients into a contiguous buffer as they are produced."""
    reduce_scatter: bool = deepspeed_only(True)
    """Use reduce-scatter (not all-reduce) to average gradients."""
    reduce_bucket_size: int = 500_000_000
    """Elements reduced per gradient bucket."""
    use_multi_rank_bucket_allreduce: bool = deepspeed_only(True)
    """DeepSpeed bucket-combining option."""
    allgather_partitions: bool = deepspeed_only(True)
    """Stage 1/2: all-gather updated partitions (vs. broadcasts)."""
    allgather_bucket_size: int = deepspeed_only(500_000_000)
    """Stage 1/2: elements all-gathered at a time."""
    overlap_comm: bool | None = deepspeed_only(None)
    """Overlap gradient reduction with backward; defaults to True at stage 3, else False."""
    load_from_fp32_weights: bool = True
    """Stages 1-2 in fp16/bf16: on load, the fp32 masters take the saved fp32 values (true)
    or the 16-bit weights' (false), as in DeepSpeed (checkpoint/load.py,
    [Note: masters from 16-bit weights])."""
    elastic_checkpoint: bool = deepspeed_only(False)
    """Load checkpoints saved at another world size (DeepSpeed: no longer supported)."""
    offload_param: OffloadParamConfig | None = None
    """Parameter offload block (device cpu/nvme) or None; stage 3 only (config/offload.py,
    zerolite/offload/plan.py)."""
    offload_optimizer: OffloadOptimizerConfig | None = None
    """Optimizer-state offload block (device cpu/nvme) or None (config/offload.py)."""
    sub_group_size: int = 1_000_000_000
    """Elements per chunk of the optimizer step when offload_optimizer.device is nvme."""
    stage3_prefetch_bucket_size: int = 50_000_000
    """Stage 3: parameter elements fetched ahead of use."""
    stage3_param_persistence_threshold: int = 100_000
    """Stage 3: parameters with at most this many elements stay gathered between steps (after
    their first use)."""
    stage3_model_persistence_threshold: int = sys.maxsize
    """Stage 3: bound on the total elements of those persistent parameters (taken in model
    order until the next one would exceed it)."""
    stage3_max_live_parameters: int = 1_000_000_000
    """Stage 3: max gathered parameter elements resident at once."""
    stage3_max_reuse_distance: int = 1_000_000_000
    """Stage 3: keep a parameter if it is reused within this many elements."""
    stage3_gather_16bit_weights_on_model_save: bool = False
    """Stage 3: gather full 16-bit weights when saving the model."""
    ignore_unused_parameters: bool = deepspeed_only(True)
    """Tolerate parameters that receive no gradient."""
    legacy_stage1: bool = deepspeed_only(False)
    """DeepSpeed's old stage-1 implementation."""
    round_robin_gradients: bool = deepspeed_only(False)
    """Stage 1/2 CPU-offload gradient copy scheduling."""
    zero_hpz_partition_size: int = 1
    """ZeRO++ hpZ, stage 3: after a unit's forward each rank keeps a secondary shard (1/h of
    the unit's compute-dtype params, its slice within a group of h consecutive ranks of one
    node), and the unit's backward all-gather runs over that group only, so nothing crosses
    nodes; the secondary shards are dropped after the unit's backward. Costs up to
    (compute-dtype bytes) x params / h per rank while held. Must divide the ranks per node
    (LOCAL_WORLD_SIZE) and the world size; 0 or 1 = off (docs/hpz.md)."""
    zero_quantized_weights: bool = False
    """ZeRO++: quantize weights for the parameter all-gather."""
    zero_quantized_nontrainable_weights: bool = deepspeed_only(False)
    """ZeRO++: store frozen weights quantized; true is refused (support.py,
    [Note: refused when switched on])."""
    zero_quantized_gradients: bool = False
    """ZeRO++: quantize gradients for the reduce-scatter."""
    mics_shard_size: int = deepspeed_only(-1)
    """MiCS shard group size; -1 = off (MiCS is not supported by zerolite)."""
    mics_hierarchical_params_gather: bool = deepspeed_only(False)
    """MiCS hierarchical all-gather."""
    memory_efficient_linear: bool = deepspeed_only(True)
    """DeepSpeed's memory-efficient linear for stage 3."""
    pipeline_loading_checkpoint: bool = deepspeed_only(False)
    """Load checkpoints in pipeline mode."""
    override_module_apply: bool = deepspeed_only(True)
    """Override nn.Module.apply under stage 3."""
    log_trace_cache_warnings: bool = deepspeed_only(False)
    """Log stage-3 trace cache invalidations."""
    module_granularity_threshold: int = deepspeed_only(0)
    """Stage 3: fetch small modules as one unit."""
    use_all_reduce_for_fetch_params: bool = deepspeed_only(False)
    """Stage 3: fetch parameters with all-reduce."""
    leaf_module: dict | None = None
    """Modules the engine marks as ZeRO-3 leaves ({classes, names, name_suffixes}; classes
    default to DeepSpeed's MoE blocks): zerolite/zero/leaf_modules.py."""

    @classmethod
    def _preprocess(cls, d, ctx):
        # Note: DeepSpeed's deprecated booleans map onto the offload blocks.
        for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
            if old in d:
                val = check_bool(join(cls._PATH, old), d[old], none_ok=True)
                logger.warning("zerolite config: %s.%s is deprecated; use %s.%s", cls._PATH, old,
                               cls._PATH, new)
                if val and new not in d:
                    d[new] = {"device": "cpu"}
        return d

    @classmethod
    def _auto_rules(cls, ctx: ParseContext):
        h = ctx.hidden_size
        if h is None:
            why = "hidden_size unknown; kept DeepSpeed's default"
            return {"reduce_bucket_size": (500_000_000, why),
                    "stage3_prefetch_bucket_size": (50_000_000, why),
                    "stage3_param_persistence_threshold": (100_000, why)}
        return {"reduce_bucket_size": (h * h, f"hidden_size**2, hidden_size={h}"),
                "stage3_prefetch_bucket_size": (int(0.9 * h * h), f"0.9*hidden_size**2, hidden_size={h}"),
                "stage3_param_persistence_threshold": (10 * h, f"10*hidden_size, hidden_size={h}")}

    def __post_init__(self):
        p = self._PATH
        self.stage = check_int(f"{p}.stage", self.stage, ge=0, le=3)
        for name, value in list(vars(self).items()):
            if name in ("stage", "offload_param", "offload_optimizer", "leaf_module"):
                continue
            if name == "overlap_comm":
                value = check_bool(f"{p}.overlap_comm", value, none_ok=True)
                self.overlap_comm = (self.stage == 3) if value is None else value
            elif name == "mics_shard_size":
                self.mics_shard_size = check_int(f"{p}.{name}", value, ge=-1)
                if self.mics_shard_size > 0:
                    fail(f"{p}.{name}", value, "-1 (MiCS sharding is not supported by zerolite)")
            elif isinstance(self.__dataclass_fields__[name].default, bool):
                setattr(self, name, check_bool(f"{p}.{name}", value))
            elif name == "sub_group_size":  # DeepSpeed divides by it: 0 is not "off"
                setattr(self, name, check_int(f"{p}.{name}", value, gt=0))
            else:
                setattr(self, name, check_int(f"{p}.{name}", value, ge=0))
        self.leaf_module = parse_leaf_module(f"{p}.leaf_module", self.leaf_module)
        self.offload_param = parse_offload(f"{p}.offload_param", "offload_param", self.offload_param)
        self.offload_optimizer = parse_offload(f"{p}.offload_optimizer", "offload_optimizer",
                                                self.offload_optimizer)
        if self.zero_hpz_partition_size > 1 and self.stage != 3:
            fail_msg(f"{p}.zero_hpz_partition_size", f"{self.zero_hpz_partition_size} needs "
                     f"{p}.stage 3 (only stage 3 gathers parameters again in backward), got "
                     f"stage {self.stage}; set it to 1 or use stage 3")
        if self.offload_param and self.stage != 3:
            fail_msg(f"{p}.offload_param.device", f"{self.offload_param.device!r} needs "
                     f"{p}.stage 3 (parameters are only partitioned there, as in DeepSpeed), "
                     f"got stage {self.stage}")
        if self.offload_optimizer and self.offload_optimizer.ratio < 1.0 and self.stage != 3:
            fail_msg(f"{p}.offload_optimizer.ratio", "partial offloading (ratio < 1) needs "
                     f"{p}.stage 3, got stage {self.stage}")


@dataclass
class ActivationCheckpointingConfig(Section):
    """``activation_checkpointing``: DeepSpeed's activation checkpointing options."""

    _PATH: ClassVar[str] = "activation_checkpointing"

    partition_activations: bool = False
    """Partition checkpointed activations across model-parallel ranks."""
    contiguous_memory_optimization: bool = False
    """Copy checkpoints into a contiguous buffer."""
    cpu_checkpointing: bool = False
    """Offload checkpointed activations to CPU."""
    number_checkpoints: int | None = None
    """Number of checkpoints (for contiguous buffers)."""
    synchronize_checkpoint_boundary: bool = False
    """Synchronize the device at each checkpoint boundary."""
    profile: bool = False
    """Profile the checkpointed forward/backward."""

    def __post_init__(self):
        p = self._PATH
        for name in ("partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                     "synchronize_checkpoint_boundary", "profile"):
            setattr(self, name, check_bool(f"{p}.{name}", getattr(self, name)))
        self.number_checkpoints = check_int(f"{p}.number_checkpoints", self.number_checkpoints,
                                            ge=1, none_ok=True)


@dataclass
class SparseGradientsConfig(Section):
    """``"zerolite": {"sparse_gradients": {...}}``: top-k sparsified gradient reduction with
    error feedback (stages 2-3; comm/sparse.py). Each rank sends, per unit, only the largest
    ``ratio`` of its gradient's entries (index + value) to the shards' owners."""

    _PATH: ClassVar[str] = "zerolite.sparse_gradients"

    ratio: float = 0.01
    """Fraction of a unit's gradient elements each rank sends per reduce (0 < ratio <= 1)."""
    error_feedback: bool = True
    """Keep what was not sent (a full fp32 unit-sized residual per rank) and add it to the next
    gradient. Costs 4 bytes x parameters per rank: ZeRO's gradient-memory saving, given back."""
    warmup_steps: int = 0
    """Optimizer steps reduced densely (exactly) before sparsification starts."""

    def __post_init__(self):
        p = self._PATH
        self.ratio = check_float(f"{p}.ratio", self.ratio, gt=0, le=1)
        self.error_feedback = check_bool(f"{p}.error_feedback", self.error_feedback)
        self.warmup_steps = check_int(f"{p}.warmup_steps", self.warmup_steps, ge=0)


@dataclass
class ZeroliteExtrasConfig(Section):
    """Top-level ``"zerolite"`` block: options zerolite adds beyond DeepSpeed's keys."""

    _PATH: ClassVar[str] = "zerolite"

    comm_timeout_s: int = 300
    """Timeout in seconds of every collective; a stuck rank fails instead of hanging."""
    quantized_gradients_bits: int = 8
    """Bits per element when zero_quantized_gradients is on (4 or 8)."""
    quantized_block_size: int = 256
    """Elements per quantization block (power of two >= 32)."""
    quantized_error_feedback: bool = False
    """Carry quantization error into the next step's gradients."""
    unit_policy: list | None = None
    """Module class names that form ZeRO-3 gather units; null = zerolite's default policy."""
    sparse_gradients: SparseGradientsConfig | None = None
    """Top-k sparsified gradients with error feedback ({ratio, error_feedback, warmup_steps};
    stages 2-3, not with zero_quantized_gradients); null = exact (dense) reduction."""
    master_rounding: str = "stochastic"
    """How an optimizer step stores bf16 master weights (bf16.bf16_master_weights_and_grads,
    config-built Adam/AdamW): "stochastic" (rounds up or down with probability by distance;
    no extra memory), "kahan" (a bf16 compensation buffer carries the bits each rounding
    drops into the next step; 2 more bytes per parameter), or "nearest" (what DeepSpeed
    does: updates below half a bf16 ulp of the weight are lost). The default is the one
    that measured best (docs/precision.md): as close to fp32 masters as kahan, at
    DeepSpeed's bytes."""
    reduce_once_per_step: bool = False
    """With gradient accumulation at stages 2-3: keep full fp32 gradients across micro-steps
    and reduce-scatter once per optimizer step instead of every micro-step (FSDP2's
    set_requires_gradient_sync(False)). Costs 4 bytes x parameters per rank."""
    watchdog: bool = True
    """Heartbeat/stall watchdog on every rank of a multi-rank run (zerolite/watchdog/)."""
    watchdog_heartbeat_timeout_s: float = 20.0
    """A rank whose heartbeat is older than this is declared hung (stopped or dead)."""
    watchdog_stall_timeout_s: float = 45.0
    """Floor of the no-progress limit: a rank that entered no collective for
    max(this, watchdog_stall_step_factor x the slowest step seen) is declared hung."""
    watchdog_stall_step_factor: float = 5.0
    """Multiple of the slowest observed step time a rank may go without progress."""
    watchdog_interval_s: float = 1.0
    """Seconds between heartbeats (and between checks of the others)."""

    @classmethod
    def _preprocess(cls, d: dict, ctx: ParseContext) -> dict:
        sparse = d.get("sparse_gradients")
        if sparse is not None:
            d["sparse_gradients"] = SparseGradientsConfig.from_dict(sparse, ctx)
        return d

    def __post_init__(self):
        p = self._PATH
        self.comm_timeout_s = check_int(f"{p}.comm_timeout_s", self.comm_timeout_s, gt=0)
        if self.sparse_gradients is not None \
                and not isinstance(self.sparse_gradients, SparseGradientsConfig):
            fail(f"{p}.sparse_gradients", self.sparse_gradients,
                 "an object {ratio, error_feedback, warmup_steps} or null")
        bits = self.quantized_gradients_bits
        if isinstance(bits, bool) or bits not in (4, 8):
            fail(f"{p}.quantized_gradients_bits", bits, "4 or 8")
        self.quantized_gradients_bits = int(bits)
        bs = check_int(f"{p}.quantized_block_size", self.quantized_block_size, ge=32)
        if bs & (bs - 1):
            fail(f"{p}.quantized_block_size", bs, "a power of two >= 32")
        self.quantized_block_size = bs
        self.quantized_error_feedback = check_bool(f"{p}.quantized_error_feedback",
                                                   self.quantized_error_feedback)
        self.reduce_once_per_step = check_bool(f"{p}.reduce_once_per_step",
                                               self.reduce_once_per_step)
        self.master_rounding = check_str(f"{p}.master_rounding", self.master_rounding,
                                         choices=MASTER_ROUNDINGS)
        self.watchdog = check_bool(f"{p}.watchdog", self.watchdog)
        for name in ("watchdog_heartbeat_timeout_s", "watchdog_stall_timeout_s",
                     "watchdog_interval_s"):
            setattr(self, name, check_float(f"{p}.{name}", getattr(self, name), gt=0))
        self.watchdog_stall_step_factor = check_float(
            f"{p}.watchdog_stall_step_factor", self.watchdog_stall_step_factor, ge=1)
        if self.watchdog_interval_s * 3 > self.watchdog_heartbeat_timeout_s:
            fail(f"{p}.watchdog_interval_s", self.watchdog_interval_s,
                 f"at most a third of watchdog_heartbeat_timeout_s "
                 f"({self.watchdog_heartbeat_timeout_s}), or one late beat reads as a hang")
        up = self.unit_policy
        if up is not None:
            if not isinstance(up, (list, tuple)) or not all(isinstance(s, str) and s for s in up):
                fail(f"{p}.unit_policy", up, "a list of module class names or null")
            self.unit_policy = list(up)


_MONITOR_DEFAULTS = {"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"}


def parse_monitor(path: str, v: Any, ctx: ParseContext) -> dict | None:
    """``csv_monitor`` / ``tensorboard``: {enabled, output_path, job_name}; absent -> None."""
    if v is None:
        return None
    check_object(path, v)
    out = dict(_MONITOR_DEFAULTS)
    for key, value in v.items():
        kp = join(path, key)
        if key == "enabled":
            out[key] = check_bool(kp, value)
        elif key in ("output_path", "job_name"):
            out[key] = check_str(kp, value)
        else:
            ctx.unknown.append(kp)
    return out
