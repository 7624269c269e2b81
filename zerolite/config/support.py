"""Which DeepSpeed keys zerolite honours, accepts but ignores, or rejects.

"honoured": changes what zerolite does. "accepted-ignored": parsed and validated (or just
tolerated) so DeepSpeed configs load unchanged, but has no effect; the engine logs these once.
"rejected": loading fails when the feature is switched on (e.g. ``amp.enabled: true``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._util import fail
from .sections import (
    ActivationCheckpointingConfig, Bf16Config, DataTypesConfig, Fp16Config, SparseGradientsConfig,
    TorchAutocastConfig, ZeroliteExtrasConfig, ZeroOptimizationConfig, is_deepspeed_only,
)

HONOURED, IGNORED, REJECTED = "honoured", "accepted-ignored", "rejected"

_REMOVED = "DeepSpeed 0.19 removed it and refuses the block"
SWITCHED_ON_REFUSED: dict[str, tuple[str, str]] = {
    "data_efficiency.enabled": ("true", "DeepSpeed's data-efficiency library (curriculum "
                                "sampling, random-LTD) is not implemented"),
    "tensor_parallel.autotp_size": ("> 1", "tensor parallelism is not implemented (zerolite "
                                    "is ZeRO data parallelism only)"),
    "sequence_parallel_size": ("> 1", "sequence parallelism is not implemented (zerolite is "
                               "ZeRO data parallelism only)"),
    "zero_optimization.zero_quantized_nontrainable_weights": (
        "true", "int8 storage of frozen weights is not implemented"),
    "zero_optimization.zenflow": ("set", "ZenFlow's selective gradient updates are not "
                                  "implemented"),
    "zero_optimization.zeropp_loco_param": ("set", f"LoCo error feedback: {_REMOVED}"),
    "fp16.fp16_master_weights_and_grads": ("true", "fp16 master weights are not implemented "
                                           "(bf16.bf16_master_weights_and_grads is)"),
    "curriculum_learning.enabled": ("true", f"legacy curriculum learning: {_REMOVED}"),
    "progressive_layer_drop.enabled": ("true", f"progressive layer drop: {_REMOVED}"),
    "quantize_training.enabled": ("true", f"Mixture-of-Quantization: {_REMOVED}"),
    "elasticity.enabled": ("true", f"elastic training: {_REMOVED}; set the batch sizes "
                           "directly"),
}
"""[Note: refused when switched on] Keys of DeepSpeed features that change what is trained
(the data, the model's forward, the precision, the parallel layout) and that zerolite does not
implement: loading fails, naming the key, when one is switched on ("true": the value is
true; "> 1": a number above 1; "set": any value but null), so a program never trains
differently in silence. Switched off, their blocks load without effect."""

TOP_LEVEL_IGNORED = (
    "sparse_gradients", "memory_breakdown", "flops_profiler", "comms_logger", "wandb", "comet",
    "aio", "checkpoint", "elasticity", "autotuning", "compression_training",
    "data_efficiency", "curriculum_learning", "pipeline", "sparse_attention", "nebula", "eigenvalue",
    "progressive_layer_drop", "quantize_training", "disable_allgather",
    "seq_parallel_communication_data_type", "graph_harvesting", "dump_state",
    "use_node_local_storage", "load_universal_checkpoint", "compile",
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
    "zero_force_ds_cpu_optimizer", "data_types", "torch_autocast",
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
    for key in SWITCHED_ON_REFUSED:
        table[key] = REJECTED
    for section, cls in (("data_types", DataTypesConfig), ("torch_autocast", TorchAutocastConfig)):
        for f in dataclasses.fields(cls):
            table[f"{section}.{f.name}"] = HONOURED
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


def refuse_switched_on(raw: dict) -> None:
    """Raise, naming the key, if `raw` switches on a feature of SWITCHED_ON_REFUSED."""
    for key, (when, why) in SWITCHED_ON_REFUSED.items():
        node: Any = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or node is False:
            continue
        on = {"true": node is True, "> 1": isinstance(node, (int, float))
              and not isinstance(node, bool) and node > 1, "set": True}[when]
        if on:
            expected = {"true": "false", "> 1": "at most 1", "set": "null"}[when]
            fail(key, node, f"{expected} ({why})")
