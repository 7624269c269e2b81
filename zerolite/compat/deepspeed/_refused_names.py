"""DeepSpeed names zerolite refuses, module by module, with the reason: each becomes a stub in
its alias module (a class that cannot be instantiated, a function that raises, a module whose
attributes raise), so importing the name works and using it raises
DeepSpeedFeatureNotSupported naming it (_refused.py). docs/deepspeed_api.md lists them."""
from __future__ import annotations

import types

from zerolite.compat.deepspeed._refused import (
    DeepSpeedFeatureNotSupported, message, refused_class, refused_function,
)

_INFERENCE = "DeepSpeed-Inference kernels and the inference engine"
_TP = "tensor parallelism (zerolite is ZeRO data parallelism only)"
_PIPE = "pipeline parallelism"
_UCKPT = ("DeepSpeed-format checkpoint tools (universal checkpoints, 3D reshaping); zerolite's "
          "checkpoints are their own format and reshard on load: see zerolite.checkpoint")

REFUSED: dict[str, dict[str, tuple[str, str]]] = {
    "deepspeed": {
        "DeepSpeedHybridEngine": ("class", "the hybrid engine (training with inference kernels)"),
        "DeepSpeedInferenceConfig": ("class", _INFERENCE),
        "default_inference_config": ("function", _INFERENCE),
        "DeepSpeedTransformerLayer": ("class", "DeepSpeed's fused transformer-layer kernels"),
        "DeepSpeedTransformerConfig": ("class", "DeepSpeed's fused transformer-layer kernels"),
        "replace_transformer_layer": ("function", "kernel injection (module_inject)"),
        "module_inject": ("module", "kernel injection (module_inject)"),
        "DualPipeVEngine": ("class", _PIPE),
        "DualPipeVModule": ("class", _PIPE),
        "set_autotp_mode": ("function", _TP),
        "merge_tp_model_init_into_config": ("function", _TP),
        "record_tp_model_init_args": ("function", _TP),
        "resolve_per_head_muon_after_sharding": ("function", "the Muon optimizer"),
        "set_optimizer_flags": ("function", "the Muon optimizer"),
    },
    "deepspeed.ops.adam": {name: ("class", "ZenFlow (selective, stalled optimizer updates)")
                           for name in ("ZenFlowCPUAdam", "ZenFlowSelectiveAdamW",
                                        "ZenFlowSelectiveAdamW_stage3")},
    "deepspeed.zero": {"TiledLinear": ("class", "TiledLinear (memory-centric tiling)"),
                       "TiledLinearReturnBias": ("class", "TiledLinear (memory-centric tiling)")},
    "deepspeed.comm": {"inference_all_reduce": ("function", _INFERENCE),
                       "initialize_mesh_device": ("function", "device meshes (sequence and "
                                                  "tensor parallelism)"),
                       "enable_symm_mem_for_group": ("function", "symmetric-memory collectives")},
    "deepspeed.checkpoint": {name: ("class" if name[0].isupper() else "function", _UCKPT)
                             for name in ("DeepSpeedCheckpoint", "ZeROCheckpoint",
                                          "SubparamShape", "enable_universal_checkpoint",
                                          "get_layer_ckpt_name_for_rank",
                                          "get_model_ckpt_name_for_rank",
                                          "get_zero_ckpt_name_for_rank", "merge_state",
                                          "model_3d_desc", "get_model_3d_descriptor",
                                          "reshape_meg_2d_parallel")},
    "deepspeed.utils": {name: ("function", _TP) for name in (
        "get_model_parallel_group", "get_tensor_model_parallel_group",
        "get_tensor_model_parallel_src_rank", "set_tensor_model_parallel_rank",
        "set_tensor_model_parallel_world_size", "expert_tensor_parallel_world_size")},
}


class _RefusedModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise DeepSpeedFeatureNotSupported(message(f"{self.__name__}.{name}", self._why))


def _stub(full: str, kind: str, why: str):
    if kind == "class":
        return refused_class(full, why)
    if kind == "module":
        mod = _RefusedModule(full, f"Refused: {why}.")
        mod._why = why
        return mod
    return refused_function(full, why)


def refused_stubs(module: str) -> dict:
    """The stubs of `module` (a DeepSpeed module name), to add to its alias's namespace."""
    return {name: _stub(f"{module}.{name}", kind, why)
            for name, (kind, why) in REFUSED.get(module, {}).items()}
