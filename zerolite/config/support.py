"""Which DeepSpeed keys zerolite honours, accepts but ignores, or rejects.

"honoured": changes what zerolite does. "accepted-ignored": parsed and validated (or just
tolerated) so DeepSpeed configs load unchanged, but has no effect; the engine logs these once.
"rejected": loading fails when the feature is switched on (e.g. ``amp.enabled: true``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .sections import (
    ActivationCheckpointingConfig, Bf16Config, Fp16Config, SparseGradientsConfig,
    ZeroliteExtrasConfig, ZeroOptimizationConfig, is_deepspeed_only,
)

HONOURED, IGNORED, REJECTED = "honoured", "accepted-ignored", "rejected"

TOP_LEVEL_IGNORED = (
    "sparse_gradients", "memory_breakdown", "flops_profiler", "comms_logger", "wandb", "comet",
    "aio", "checkpoint", "data_types", "elasticity", "autotuning", "compression_training",
    "data_efficiency", "curriculum_learning", "pipeline", "sparse_attention", "nebula", "eigenvalue",
    "progressive_layer_drop", "quantize_training", "disable_allgather",
    "seq_parallel_communication_data_type", "graph_harvesting", "dump_state",
    "use_node_local_storage", "load_universal_checkpoint", "torch_autocast", "compile",
    "weight_quantization", "hybrid_engine", "tensor_parallel", "sequence_parallel_size", "timers",
    "activation_checkpointing", "csv_monitor", "tensorboard", "gradient_accumulation_dtype",
)
"""Top-level DeepSpeed keys that load without effect (never reported as unknown)."""

_HONOURED_TOP = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "optimizer.type", "optimizer.params", "scheduler", "scheduler.type",
    "scheduler.params", "fp16", "bf16", "bfloat16", "bf16.enabled", "gradient_clipping",
    "steps_per_print", "wall_clock_breakdown", "dataloader_drop_last", "communication_data_type",
    "prescale_gradients", "gradient_predivide_factor", "zero_optimization", "zerolite",
    "csv_monitor", "tensorboard", "checkpoint.tag_validation", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
)
# Note: overlap_comm is accepted but not needed: reductions always overlap backward (bounded
# by reduce_bucket_size) and prefetch is governed by stage3_prefetch_bucket_size.


def _field_support(f) -> str:
    return IGNORED if is_deepspeed_only(f) else HONOURED


def _build() -> dict[str, str]:
    table: dict[str, str] = {k: IGNORED for k in TOP_LEVEL_IGNORED}
    table.update({k: HONOURED for k in _HONOURED_TOP})
    table["amp"] = REJECTED
    table["managed_gradient_accumulation"] = REJECTED  # false is; true is what zerolite does
    for f in dataclasses.fields(Fp16Config):
        table[f"fp16.{f.name}"] = _field_support(f)
    for key in Bf16Config._EXTRA_KNOWN:
        table[f"bf16.{key}"] = IGNORED
    zero = ZeroOptimizationConfig
    for f in dataclasses.fields(zero):
        table[f"zero_optimization.{f.name}"] = _field_support(f)
    for alias, name in zero._ALIASES.items():
        table[f"zero_optimization.{alias}"] = table[f"zero_optimization.{name}"]
    for key in zero._EXTRA_KNOWN:
        table[f"zero_optimization.{key}"] = IGNORED
    table["zero_optimization.mics_shard_size"] = REJECTED
    for f in dataclasses.fields(ActivationCheckpointingConfig):
        table[f"activation_checkpointing.{f.name}"] = IGNORED
    for f in dataclasses.fields(ZeroliteExtrasConfig):
        table[f"zerolite.{f.name}"] = HONOURED
    for f in dataclasses.fields(SparseGradientsConfig):
        table[f"zerolite.sparse_gradients.{f.name}"] = HONOURED
    return table


KEY_SUPPORT: dict[str, str] = _build()
"""Dotted DeepSpeed key -> "honoured" / "accepted-ignored" / "rejected"."""

_SECTIONS = ("zero_optimization", "fp16", "bf16", "bfloat16")


def _section_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for prefix, cls in (("zero_optimization", ZeroOptimizationConfig), ("fp16", Fp16Config)):
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name, default in defaults.items():
            out[f"{prefix}.{name}"] = default
        for alias, name in getattr(cls, "_ALIASES", {}).items():
            out[f"{prefix}.{alias}"] = defaults[name]
    return out


_DEFAULTS = _section_defaults()


def _inert(key: str, value: Any) -> bool:
    """Values that change nothing: null, false, DeepSpeed's default, or offload device "none"."""
    if value is None or value is False:
        return True
    if key in _DEFAULTS and type(value) is not bool and type(_DEFAULTS[key]) is not bool:
        if value == _DEFAULTS[key]:
            return True
    elif key in _DEFAULTS and value is _DEFAULTS[key]:
        return True
    return isinstance(value, dict) and str(value.get("device", "")).lower() == "none"


def accepted_ignored_keys(cfg) -> list[str]:
    """Dotted keys present in ``cfg.raw`` that zerolite accepts but does not act on."""
    out: list[str] = []
    for key, value in cfg.raw.items():
        if KEY_SUPPORT.get(key) == IGNORED and not _inert(key, value):
            out.append(key)
        if key in _SECTIONS and isinstance(value, dict):
            prefix = "bf16" if key == "bfloat16" else key
            for sub, subval in value.items():
                dotted = f"{prefix}.{sub}"
                if KEY_SUPPORT.get(dotted) == IGNORED and not _inert(dotted, subval):
                    out.append(f"{key}.{sub}")
    return out
