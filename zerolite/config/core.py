"""``ZeroConfig`` (the whole validated config) and ``load_config`` (file / dict / args -> config)."""

from __future__ import annotations

import argparse
import base64
import binascii
import copy
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from zerolite.errors import ZeroliteConfigError

from ._util import (
    TORCH_DTYPES, ParseContext, check_bool, check_dtype_name, check_float, check_int,
    check_object, fail, fail_msg, is_auto,
    logger, show, to_jsonable,
)
from .batch import BATCH_KEYS, derive_batch
from .optim import OptimizerConfig, SchedulerConfig
from .sections import (
    ActivationCheckpointingConfig, Bf16Config, DataTypesConfig, Fp16Config, TorchAutocastConfig,
    ZeroliteExtrasConfig, ZeroOptimizationConfig, parse_monitor,
)
from .support import TOP_LEVEL_IGNORED, refuse_switched_on


class ZeroliteConfigWarning(UserWarning):
    """Config keys zerolite does not recognise (likely typos)."""



_TOP_MODELLED = frozenset(BATCH_KEYS) | {
    "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "amp", "gradient_clipping",
    "prescale_gradients", "gradient_predivide_factor", "communication_data_type",
    "steps_per_print", "wall_clock_breakdown", "dataloader_drop_last", "zero_optimization",
    "activation_checkpointing", "zerolite", "csv_monitor", "tensorboard",
    "managed_gradient_accumulation", "zero_allow_untested_optimizer", "data_types",
    "zero_force_ds_cpu_optimizer", "torch_autocast"}


@dataclass
class ZeroConfig:
    """A fully validated DeepSpeed-style config for one world size."""

    train_batch_size: int
    """Samples per optimizer step, over all ranks."""
    train_micro_batch_size_per_gpu: int
    """Samples per forward/backward on one rank."""
    gradient_accumulation_steps: int
    """Micro-batches accumulated per optimizer step."""
    world_size: int
    """Data-parallel ranks the batch triangle was derived for."""
    optimizer: OptimizerConfig | None = None
    """Optimizer to build, or None when the caller passes its own."""
    scheduler: SchedulerConfig | None = None
    """LR schedule to build, or None."""
    fp16: Fp16Config = field(default_factory=Fp16Config)
    """float16 mixed precision and loss scaling."""
    bf16: Bf16Config = field(default_factory=Bf16Config)
    """bfloat16 mixed precision."""
    gradient_clipping: float = 0.0
    """Max global gradient norm; 0.0 = no clipping."""
    prescale_gradients: bool = False
    """Divide gradients by world size before (rather than after) the reduction."""
    gradient_predivide_factor: float = 1.0
    """Divide gradients by this factor before the reduction, the rest after."""
    communication_data_type: str | None = None
    """dtype of gradient reductions: "fp32", "fp16", "bf16" or None (= training dtype)."""
    steps_per_print: int = 10
    """Log progress every this many optimizer steps."""
    wall_clock_breakdown: bool = False
    """Time forward/backward/step and log the breakdown."""
    dataloader_drop_last: bool = False
    """Drop the last incomplete batch in engine-built data loaders."""
    zero_allow_untested_optimizer: bool = False
    """Train an optimizer outside DeepSpeed's tested list (torch Adam, AdamW, Adagrad and
    DeepSpeed's Adam, Adagrad and Lion classes) at ZeRO stages 1-3, or one that is not
    element-wise at stage 0: it steps flat shards, so an optimizer that reads a parameter's
    shape or whole norm computes something else than on the full parameter
    (optim/builder.py)."""
    zero_force_ds_cpu_optimizer: bool = True
    """With offload_optimizer on cpu or nvme, refuse an optimizer that is not DeepSpeedCPUAdam
    or DeepSpeedCPULion (false: accept it, as DeepSpeed)."""
    zero_optimization: ZeroOptimizationConfig = field(default_factory=ZeroOptimizationConfig)
    """ZeRO stage and its knobs."""
    data_types: DataTypesConfig = field(default_factory=DataTypesConfig)
    """Gradient-accumulation, parameter and buffer dtypes under fp16/bf16."""
    torch_autocast: TorchAutocastConfig = field(default_factory=TorchAutocastConfig)
    """DeepSpeed's torch_autocast mode (fp32 parameters, the forward under torch.autocast)."""
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig)
    """DeepSpeed activation checkpointing options (accepted, not acted on)."""
    zerolite: ZeroliteExtrasConfig = field(default_factory=ZeroliteExtrasConfig)
    """zerolite's own options (top-level "zerolite" block)."""
    checkpoint_tag_validation: str = "WARN"
    """checkpoint.tag_validation: "WARN", "IGNORE" or "FAIL" when ranks save under different
    tags (checkpoint/save.py)."""
    csv_monitor: dict | None = None
    """{enabled, output_path, job_name} or None."""
    tensorboard: dict | None = None
    """{enabled, output_path, job_name} or None."""
    raw: dict = field(default_factory=dict, repr=False)
    """The JSON exactly as given."""

    def __post_init__(self):
        self.world_size = check_int("world_size", self.world_size, gt=0)
        if self.fp16.enabled and self.bf16.enabled:
            fail_msg("fp16.enabled/bf16.enabled", "both are true; enable at most one of them")
        mode = "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else None
        if self.data_types.param_dtype not in (None, mode):
            fail_msg("data_types.param_dtype",
                     f"{self.data_types.param_dtype!r} conflicts with the training dtype "
                     f"({mode or 'fp32'}: fp16/bf16 'enabled'); set it to match or omit it")
        if self.torch_autocast.enabled and mode is not None:
            fail_msg("torch_autocast.enabled", f"true together with {mode}.enabled: "
                     "torch_autocast trains fp32 parameters under torch.autocast, "
                     f"{mode} trains {mode} parameters; enable one of them")
        if self.torch_autocast.enabled and self.zero_optimization.zero_quantized_weights:
            fail_msg("torch_autocast.enabled", "true together with "
                     "zero_optimization.zero_quantized_weights (DeepSpeed refuses both too)")
        self.gradient_clipping = check_float("gradient_clipping", self.gradient_clipping, ge=0)
        self.prescale_gradients = check_bool("prescale_gradients", self.prescale_gradients)
        self.gradient_predivide_factor = check_float("gradient_predivide_factor",
                                                     self.gradient_predivide_factor, gt=0)
        self.communication_data_type = check_dtype_name("communication_data_type",
                                                        self.communication_data_type)
        self.steps_per_print = check_int("steps_per_print", self.steps_per_print, gt=0)
        self.wall_clock_breakdown = check_bool("wall_clock_breakdown", self.wall_clock_breakdown)
        self.dataloader_drop_last = check_bool("dataloader_drop_last", self.dataloader_drop_last)
        self.zero_allow_untested_optimizer = check_bool("zero_allow_untested_optimizer",
                                                        self.zero_allow_untested_optimizer)
        self.zero_force_ds_cpu_optimizer = check_bool("zero_force_ds_cpu_optimizer",
                                                      self.zero_force_ds_cpu_optimizer)
        self._check_sparse_gradients()
        self._check_bf16_masters()
        self._check_grad_accum_dtype(mode or "fp32")

    def _check_grad_accum_dtype(self, mode: str) -> None:
        """Stage 0 accumulates in the training dtype: DeepSpeed 0.19 refuses another one
        there (NotImplementedError, "unsupported mix of model_dtype and grad_accum_dtype")."""
        accum = self.data_types.grad_accum_dtype
        if self.zero_optimization.stage == 0 and accum not in (None, mode):
            fail_msg("data_types.grad_accum_dtype",
                     f"{accum!r} with {mode} training at zero_optimization.stage 0: stage 0 "
                     "accumulates gradients in the training dtype (DeepSpeed refuses this mix "
                     "too); omit it, or use stage 1-3, which accumulate in any dtype")

    def _check_sparse_gradients(self) -> None:
        """zerolite.sparse_gradients needs sharded gradients and excludes qgZ."""
        if self.zerolite.sparse_gradients is None:
            return
        zc = self.zero_optimization
        if zc.stage < 2:
            fail_msg("zerolite.sparse_gradients",
                     f"needs zero_optimization.stage 2 or 3 (the config has stage {zc.stage}): "
                     "the top-k entries are sent to the owners of gradient shards; raise the "
                     "stage or remove zerolite.sparse_gradients")
        if zc.zero_quantized_gradients:
            fail_msg("zerolite.sparse_gradients",
                     "cannot be combined with zero_optimization.zero_quantized_gradients "
                     "(both compress the same gradient reduce); turn one of them off")

    def _check_bf16_masters(self) -> None:
        """DeepSpeed's rules for bf16 master weights and optimizer states (config.py and
        ZeROOptimizer._configure_master_weights in 0.19), as errors that name the keys."""
        b = self.bf16
        if b.bf16_optimizer_states and not b.bf16_master_weights_and_grads:
            fail_msg("bf16.bf16_optimizer_states", "needs bf16.bf16_master_weights_and_grads "
                     "true too (the optimizer states follow the masters' dtype)")
        if not b.bf16_master_weights_and_grads:
            return
        stage = self.zero_optimization.stage
        if not b.enabled:
            fail_msg("bf16.bf16_master_weights_and_grads", "needs bf16.enabled true: bf16 "
                     "masters update bf16 compute weights")
        if stage not in (1, 2, 3):
            fail_msg("bf16.bf16_master_weights_and_grads", "is only supported with "
                     f"zero_optimization.stage 1, 2 or 3 (the config has stage {stage})")
        if not b.bf16_optimizer_states and self.zero_optimization.offload_optimizer is None:
            fail_msg("bf16.bf16_master_weights_and_grads",
                     "without bf16.bf16_optimizer_states needs "
                     "zero_optimization.offload_optimizer (DeepSpeed's rule: the fp32 optimizer "
                     "states then live in host memory, stepped by DeepSpeedCPUAdam); set "
                     "bf16.bf16_optimizer_states true to keep everything on the device")

    @property
    def master_dtype(self):
        """torch dtype of the master weights and reduced gradient shards the optimizer sees."""
        import torch

        return torch.bfloat16 if self.bf16.bf16_master_weights_and_grads else torch.float32

    @property
    def grad_accum_torch_dtype(self):
        """torch dtype gradients are accumulated and kept in: data_types.grad_accum_dtype,
        else the training dtype, as DeepSpeed's ([Note: gradient precision])."""
        name = self.data_types.grad_accum_dtype
        return TORCH_DTYPES[name] if name else self.precision_dtype

    @property
    def communication_torch_dtype(self):
        """torch dtype gradients are reduced in: communication_data_type, else the training
        dtype, as DeepSpeed's (fp32 under torch_autocast, whose safe modules' gradients go
        in the autocast dtype, zerolite/autocast.py)."""
        name = self.communication_data_type
        return TORCH_DTYPES[name] if name else self.precision_dtype

    @property
    def precision_dtype(self):
        """torch dtype of compute weights: bfloat16, float16 or float32."""
        import torch

        if self.bf16.enabled:
            return torch.bfloat16
        if self.fp16.enabled:
            return torch.float16
        return torch.float32

    def to_dict(self) -> dict:
        """The resolved config (defaults filled, "auto" resolved) as JSON-able DeepSpeed keys."""
        out = to_jsonable({k: getattr(self, k) for k in self.__dataclass_fields__
                           if k not in ("raw", "world_size", "checkpoint_tag_validation")})
        out["checkpoint"] = {"tag_validation": self.checkpoint_tag_validation}
        return out

    @classmethod
    def from_dict(cls, raw: dict, world_size: int, *, hidden_size: int | None = None) -> "ZeroConfig":
        """Validate ``raw`` (a parsed DeepSpeed JSON object) for ``world_size`` ranks."""
        check_object("config", raw)
        world_size = check_int("world_size", world_size, gt=0)
        hidden_size = check_int("hidden_size", hidden_size, gt=0, none_ok=True)
        ctx = ParseContext(hidden_size=hidden_size)
        for key in raw:
            if key not in _TOP_MODELLED and key not in TOP_LEVEL_IGNORED:
                ctx.unknown.append(key)
        try:
            return cls._build(copy.deepcopy(raw), world_size, ctx)
        finally:
            if ctx.unknown:
                # Note: one warning for all keys, so a typo is seen without drowning the log.
                warnings.warn(
                    f"zerolite config: {len(ctx.unknown)} unknown key(s) ignored: "
                    + ", ".join(ctx.unknown), ZeroliteConfigWarning, stacklevel=3)

    @classmethod
    def _build(cls, raw: dict, world_size: int, ctx: ParseContext) -> "ZeroConfig":
        refuse_switched_on(raw)
        train, micro, gas = derive_batch(raw, world_size)
        if "bf16" in raw and "bfloat16" in raw:
            fail_msg("bf16", "given twice (as 'bf16' and legacy 'bfloat16'); keep 'bf16'")
        bf16_raw = raw.get("bf16", raw.get("bfloat16"))
        amp = raw.get("amp")
        if amp is not None:
            check_object("amp", amp)
            enabled = amp.get("enabled", False)
            if not is_auto(enabled) and check_bool("amp.enabled", enabled):
                fail("amp.enabled", enabled, "false (apex AMP is not supported; use fp16 or bf16)")
        managed = raw.get("managed_gradient_accumulation", True)
        if not is_auto(managed) and not check_bool("managed_gradient_accumulation", managed):
            fail("managed_gradient_accumulation", managed,
                 "true (the engine counts micro-steps and reduces at the accumulation boundary; "
                 "DeepSpeed's caller-owned boundaries, where step() alone reduces, are not "
                 "built)")
        clip = raw.get("gradient_clipping", 0.0)
        if is_auto(clip):
            clip = 1.0
            ctx.resolved("gradient_clipping", clip, "Hugging Face Trainer default max_grad_norm")
        optimizer = OptimizerConfig.from_dict(raw.get("optimizer"), ctx)
        scalars = {k: raw[k] for k in ("prescale_gradients", "gradient_predivide_factor",
                                       "communication_data_type", "steps_per_print",
                                       "wall_clock_breakdown", "dataloader_drop_last",
                                       "zero_allow_untested_optimizer",
                                       "zero_force_ds_cpu_optimizer") if k in raw}
        for k, v in scalars.items():
            if is_auto(v):
                fail(k, v, "a concrete value ('auto' cannot be resolved for this key)")
        return cls(
            train_batch_size=train, train_micro_batch_size_per_gpu=micro,
            gradient_accumulation_steps=gas, world_size=world_size,
            optimizer=optimizer, scheduler=SchedulerConfig.from_dict(raw.get("scheduler"), ctx),
            fp16=Fp16Config.from_dict(raw.get("fp16"), ctx),
            bf16=Bf16Config.from_dict(bf16_raw, ctx),
            gradient_clipping=clip, **scalars,
            zero_optimization=_zero_section(raw.get("zero_optimization"), ctx),
            data_types=DataTypesConfig.from_dict(raw.get("data_types"), ctx),
            torch_autocast=TorchAutocastConfig.from_dict(raw.get("torch_autocast"), ctx),
            activation_checkpointing=ActivationCheckpointingConfig.from_dict(
                raw.get("activation_checkpointing"), ctx),
            zerolite=ZeroliteExtrasConfig.from_dict(raw.get("zerolite"), ctx),
            checkpoint_tag_validation=_tag_validation(raw.get("checkpoint")),
            csv_monitor=parse_monitor("csv_monitor", raw.get("csv_monitor"), ctx),
            tensorboard=parse_monitor("tensorboard", raw.get("tensorboard"), ctx),
            raw=raw,
        )


TAG_VALIDATION_MODES = ("WARN", "IGNORE", "FAIL")


def _tag_validation(block: Any) -> str:
    """checkpoint.tag_validation, any case (DeepSpeed upper-cases it); default "WARN"."""
    mode = check_object("checkpoint", block or {}).get("tag_validation", "WARN")
    if not isinstance(mode, str) or mode.upper() not in TAG_VALIDATION_MODES:
        fail("checkpoint.tag_validation", mode, "one of 'Warn', 'Ignore', 'Fail'")
    return mode.upper()


def _zero_section(v: Any, ctx: ParseContext) -> ZeroOptimizationConfig:
    if isinstance(v, bool):
        # Note: DeepSpeed's deprecated form "zero_optimization": true means stage 1.
        logger.warning("zerolite config: zero_optimization=%s is deprecated; use {\"stage\": N}", v)
        v = {"stage": 1 if v else 0}
    return ZeroOptimizationConfig.from_dict(v, ctx)


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ZeroliteConfigError(f"{key}: duplicate key in a JSON object; keep one")
        out[key] = value
    return out


def read_json(path: str | os.PathLike) -> dict:
    """Read a DeepSpeed JSON config file; errors name the path (and line/column)."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ZeroliteConfigError(f"config: file not found: {p!r} (cwd {os.getcwd()!r})") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ZeroliteConfigError(f"config: cannot read {p!r}: {e}") from None
    data = _parse_text(text, repr(p))
    if not isinstance(data, dict):
        raise ZeroliteConfigError(
            f"config: top level of {p!r} is {show(data)}; expected a JSON object {{...}}")
    return data


def _parse_text(text: str, where: str) -> Any:
    """JSON, or Hjson where the hjson package is importable (DeepSpeed reads every config
    file with hjson: comments, unquoted keys and trailing commas are accepted there)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        error = e
    except ZeroliteConfigError as e:
        raise ZeroliteConfigError(f"{e} [config file {where}]") from None
    try:
        import hjson
    except ImportError:
        raise ZeroliteConfigError(
            f"config: invalid JSON in {where} at line {error.lineno} column {error.colno}: "
            f"{error.msg} (DeepSpeed also reads Hjson; `pip install hjson` to read it here)"
        ) from None
    try:
        return hjson.loads(text, object_pairs_hook=_no_duplicates)
    except hjson.HjsonDecodeError as e:
        raise ZeroliteConfigError(f"config: invalid JSON/Hjson in {where} at line {e.lineno} "
                                  f"column {e.colno}: {e.msg}") from None


def _from_base64(text: str) -> dict | None:
    """A config passed as URL-safe base64 of its JSON (DeepSpeed accepts that in place of a
    path), or None when `text` is not one."""
    try:
        decoded = base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        return None
    if not decoded.lstrip().startswith("{"):
        return None
    data = _parse_text(decoded, "(base64 config)")
    return data if isinstance(data, dict) else None


def read_config_source(source: Any) -> dict:
    """The raw config dict from what a program passes: a dict, a path to a JSON/Hjson file,
    or a base64-encoded JSON string."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path) and isinstance(path, str):
            data = _from_base64(path)
            if data is not None:
                return data
        return read_json(path)
    fail("config", source, "a path to a JSON file or a dict")


def _pick_source(config: Any, args: Any) -> Any:
    arg_cfg = None
    if args is not None:
        arg_cfg = getattr(args, "deepspeed_config", None)
        if arg_cfg is None and getattr(args, "deepscale_config", None) is not None:
            logger.warning("zerolite config: --deepscale_config is deprecated; use --deepspeed_config")
            arg_cfg = args.deepscale_config
    if config is not None and arg_cfg is not None:
        raise ZeroliteConfigError(
            f"config: given twice, as the config argument and as args.deepspeed_config={arg_cfg!r}; "
            "pass only one")
    source = config if config is not None else arg_cfg
    if source is None:
        raise ZeroliteConfigError("config: no config given; pass a JSON path or dict "
                                  "(or --deepspeed_config PATH via args)")
    return source


def load_config(config: Any, world_size: int, *, hidden_size: int | None = None,
                args: argparse.Namespace | None = None) -> ZeroConfig:
    """Load and validate a DeepSpeed config (JSON path, dict, or None with ``args``)."""
    source = _pick_source(config, args)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        raw = read_config_source(path)
        try:
            return ZeroConfig.from_dict(raw, world_size, hidden_size=hidden_size)
        except ZeroliteConfigError as e:
            raise ZeroliteConfigError(f"{e} [config file {path!r}]") from None
    if isinstance(source, dict):
        return ZeroConfig.from_dict(source, world_size, hidden_size=hidden_size)
    fail("config", source, "a path to a JSON file or a dict")


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's launcher flags (--deepspeed, --deepspeed_config) and return the parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed-compatible configuration")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable the engine (kept for DeepSpeed script compatibility).")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="Path to a DeepSpeed JSON config.")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser
