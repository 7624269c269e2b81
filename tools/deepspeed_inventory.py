"""DeepSpeed's public API against zerolite's alias: every name of docs/deepspeed_names.json
(collected from the real DeepSpeed by tools/deepspeed_names.py) marked

    done      the alias provides it (differences from DeepSpeed: the alias modules' docstrings)
    refused   the alias has it, and using it raises DeepSpeedFeatureNotSupported naming it
    internal  DeepSpeed's own plumbing, not something programs call; INTERNAL says why
    pending   added by another open work item, listed by name in PENDING

and rendered as docs/deepspeed_api.md. tests/test_deepspeed_inventory.py fails when a name is
in none of the three, or when the committed page differs from what this renders.

The engine's methods and attributes (DeepSpeedEngine, what `deepspeed.initialize` returns) are
classified the same way against zerolite's engine (zerolite/engine.py's ZeroEngine and its
DeepSpeedAccessors mixin, zerolite/engine_accessors.py): done when a zerolite class of the
engine defines the name (not nn.Module: its `compile` is not DeepSpeed's) or ZeroEngine
assigns it as `self.<name>` (read from engine.py's source; tests/test_compat_engine_accessors.py
checks both against a real engine); refused when that definition is one of
engine_accessors.REFUSED; else ENGINE_INTERNAL / ENGINE_PENDING.

    python tools/deepspeed_inventory.py          # rewrite docs/deepspeed_api.md
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = os.path.join(ROOT, "docs", "deepspeed_names.json")
PAGE = os.path.join(ROOT, "docs", "deepspeed_api.md")
ALIAS = "zerolite.compat.deepspeed"

_FRAGMENT = "DeepSpeed's ZeRO 1-2 fragment plumbing (the safe_* functions are the API)"
_COMMLOG = "DeepSpeed's comms logger and its bookkeeping (zerolite: last_step_stats)"
_LAUNCH = "DeepSpeed's launcher / cluster-environment discovery (zerolite.cli's launcher)"
_ZINIT = "zero.Init's own machinery (partitioning, gather handles, tensor overrides)"
INTERNAL: dict[str, list[tuple[str, str]]] = {
    "deepspeed": [
        (r"DeepSpeedDataLoader", "the engine's loader class; zerolite's engine gives a torch "
                                "DataLoader (engine.training_dataloader)"),
        (r"DeepSpeedOptimizer", "base class of DeepSpeed's optimizer wrappers"),
        (r"KV|MLA_KV|MLA_Q|QUERY|NOT_HEAD_BLOCKED",
         "layout tags of automatic tensor parallelism (refused)"),
    ],
    "deepspeed.checkpoint": [(r"[A-Z][A-Z0-9_]*",
                              "key names inside DeepSpeed-format checkpoint files")],
    "deepspeed.comm": [
        (r".*_backend", "DeepSpeed's communication-backend objects (zerolite calls "
                      "torch.distributed)"),
        (r"cdb", "DeepSpeed's communication-backend object"),
        (r"set_backend", "DeepSpeed's communication-backend selection"),
        (r"init_deepspeed_backend", "DeepSpeed's communication-backend selection"),
        (r"get_.*_from_launcher", _LAUNCH), (r"in_.*", _LAUNCH), (r"mpi_discovery", _LAUNCH),
        (r"patch_.*", _LAUNCH),
        (r"comms_logger", _COMMLOG), (r"timers", _COMMLOG), (r"timed_op", _COMMLOG),
        (r"timer_summary", _COMMLOG), (r"reset_log", _COMMLOG), (r"has_comm_data", _COMMLOG),
        (r"get_comm_operation_count", _COMMLOG), (r"get_logged_comm_ops", _COMMLOG),
        (r"get_debug_log_name", _COMMLOG), (r"get_default_args", _COMMLOG),
        (r"get_msg_size_from_args", _COMMLOG), (r"get_tensor_kwarg", _COMMLOG),
        (r"get_tensor_position", _COMMLOG),
    ],
    "deepspeed.runtime.config": [
        (r"get_.*", "DeepSpeedConfig's parsing helpers (read DeepSpeedConfig's attributes)"),
        (r"DeepSpeedConfigWriter", "DeepSpeed's config-file writer utility"),
        (r"DtypeEnum", "DeepSpeed's dtype-name parsing"),
        (r"HybridEngineConfig", "config block of the hybrid engine (refused)"),
        (r"EXPERT_PARALLEL", "config key of expert parallelism (not provided)"),
        (r"TENSOR_CORE_ALIGN_SIZE", "DeepSpeedConfig's vocabulary-alignment warning"),
    ],
    "deepspeed.runtime.config_utils": [
        (r"DeepSpeedConfigObject|ScientificNotationEncoder|get_config_default|get_dict_param|"
         r"get_list_param|pp_int",
         "helpers of DeepSpeed's own config parsing (zerolite.config parses configs)"),
    ],
    "deepspeed.runtime.lr_schedules": [(r"override_.*", "helpers of get_config_from_args")],
    "deepspeed.runtime.zero.config": [
        (r"ZERO_FORMAT", "a documentation string"),
        (r"read_zero_config_deprecated", "get_zero_config's reading of `zero_optimization: "
                                        "true`"),
    ],
    "deepspeed.runtime.zero.partition_parameters": [
        (r".*Handle.*", _ZINIT), (r"CUDAQuantizer", _ZINIT), (r"QuantizationInfo", _ZINIT),
        (r"DEFAULT_TENSOR_OVERRIDES", _ZINIT), (r"DeepSpeedTensorOverride", _ZINIT),
        (r"DS_Z3_.*", _ZINIT), (r"InsertPostInitMethodToModuleSubClasses", _ZINIT),
        (r"debug_rank0", _ZINIT), (r"print_rank_0", _ZINIT), (r"empty_buffers", _ZINIT),
        (r"reuse_buffers", _ZINIT), (r"free_param", _ZINIT), (r"get_all_subclasses", _ZINIT),
        (r"get_allgather_dtype", _ZINIT), (r"get_new_tensor_fn_for_dtype", _ZINIT),
        (r"partitioned_param_data_shape", _ZINIT), (r"temp_contiguous_tensor", _ZINIT),
        (r".*_init_context", _ZINIT), (r"top_level_context", _ZINIT),
    ],
    "deepspeed.utils": [
        (r"fragment_address", _FRAGMENT), (r".*_hp_.*", _FRAGMENT),
        (r"link_hp_params", _FRAGMENT),
        (r"map_to_flat_opt_states", _FRAGMENT), (r"get_hp_fragment_mapping", _FRAGMENT),
        (r"get_caller_func", "DeepSpeed's comms-logger helper"),
        (r"instrument_w_nvtx", "DeepSpeed's NVTX profiling decorator"),
        (r"get_numactl_cmd", _LAUNCH),
        (r"initialize", "DeepSpeed's model-parallel group set-up (data parallelism only here)"),
        (r"mesh_device", "DeepSpeed's device-mesh global (not provided)"),
        (r"mpu", "DeepSpeed's model-parallel-unit global (data parallelism only here)"),
    ],
    "deepspeed.zero": [
        (r"DeepSpeedTensorOverride", _ZINIT),
        (r"DeepSpeedZeRoOffload", "the stage-3 engine's parameter-offload component"),
    ],
}
"""module -> [(regular expression matching whole names, why they are internal)], first match
wins."""

PENDING: dict[str, dict[str, str]] = {}
"""Names another open work item adds: listed by name, so nothing else can hide here."""

_ALLREDUCE = "steps of DeepSpeed's own gradient all-reduce (zerolite's reducers: zerolite/comm)"
_MOE = "mixture-of-experts state (MoE is refused; has_moe_layers is False)"
_DS_CKPT = ("bookkeeping of DeepSpeed-format checkpoint files (zerolite's checkpoints are its "
            "own format and reshard on load)")
_TIMERS = "DeepSpeed's timers and monitor events (zerolite: engine.last_step_stats, monitor)"
ENGINE_INTERNAL: list[tuple[str, str]] = [
    (r"all_gather_scalar|allreduce_and_copy|allreduce_bucket|allreduce_no_retain|"
     r"buffered_allreduce_fallback|sparse_all.*", _ALLREDUCE),
    (r"flatten|unflatten", "torch's flatten helpers DeepSpeed's all-reduce uses"),
    (r"aio_config|swap_tensor_config",
     "settings DeepSpeed's NVMe swapper reads (zerolite: the offload blocks' nvme keys)"),
    (r"checkpoint_serialization_enabled",
     "torch.save's serialization switch for DeepSpeed-format files (zerolite writes safetensors)"),
    (r"clip_fp32_gradients", "the engine's own clipping step (zerolite clips in the update)"),
    (r"compile_autosp|compile_autotp|compile_zero_optimization_stage|"
     r"uses_parallelization_pass_only",
     "deepcompile's pass selection (zerolite has no DeepCompile: is_deepcompile_enabled() is False)"),
    (r"module_forward_pre_hook|module_forward_post_hook", "deepcompile's hook handles"),
    (r"get_data_types", "picks DeepSpeed's optimizer wrapper from the data_types block"),
    (r"get_optimizer_configuration", "builds DeepSpeed's optimizer class from the config"),
    (r"log_level", "sets DeepSpeed's logger level at start-up"),
    (r"print_forward_breakdown", "the engine's MoE forward-time log"),
    (r"zero_allgather_sequential|zero_parameter_alignment",
     "switches DeepSpeed's ZeRO optimizers read (not in zerolite's config)"),
    (r"all_to_all_group|expert_data_parallel_group|expert_parallel_group|gate_modules|"
     r"moe_layers|num_experts", _MOE),
    (r"local_all_to_all_group",
     "DeepSpeed's qgZ all-to-all groups (zerolite's qgZ: zerolite/comm/quantized.py)"),
    (r"autotuning_model_info", "the autotuner's record (autotuning_enabled() is False)"),
    (r"flops|flops_profiler|fwd_duration",
     "the flops profiler's object and results (flops_profiler_enabled() is False)"),
    (r"random_ltd_scheduler", "random-LTD's scheduler (random_ltd_enabled() is False)"),
    (r"update_interval", "ZenFlow's update counter (ZenFlow is refused)"),
    (r"torch_autocast_z0_gradscaler",
     "torch_autocast's stage-0 GradScaler (zerolite's, at every stage: engine.amp_scaler)"),
    (r"mesh_device", "DeepSpeed's device mesh (sequence and tensor parallelism)"),
    (r"seq_parallel_group",
     "set by DeepSpeed only under sequence parallelism, which zerolite does not build (both "
     "engines raise AttributeError without it; get_sequence_parallel_group is refused)"),
    (r"checkpoint_engine", "DeepSpeed's checkpoint writer object (zerolite.checkpoint)"),
    (r"checkpoint_mp_rank|save_non_zero_checkpoint|save_zero_checkpoint|"
     r"loaded_checkpoint_dp_world_size|loaded_checkpoint_mp_world_size", _DS_CKPT),
    (r"engine_timers|engine_timers_cache|timers|summary_events", _TIMERS),
    (r"first_dataloader_check", "DeepSpeed's debug check that ranks got the same inputs"),
    (r"gradient_average", "the reduction-op flag DeepSpeed's reducers read (zerolite averages)"),
    (r"optimized_linear_base_weight_sharding|optimized_linear_lora_enabled",
     "set-up flags of deepspeed.linear's OptimizedLinear / LoRA"),
    (r"scale_wrt_gas", "never read by DeepSpeed (backward's scale_wrt_gas argument is the API)"),
    (r"use_ds_comm", "DeepSpeed's choice between torch.distributed and its own comm backend"),
    (r"warn_unscaled_loss", "DeepSpeed's warn-once flag"),
]
"""DeepSpeedEngine names that are DeepSpeed's plumbing -> why (regular expressions matching
whole names, first match wins)."""

ENGINE_PENDING: dict[str, str] = {}
"""DeepSpeedEngine names another open work item adds, by name (tput_timer was, for the
DeepSpeed-Chat acceptance; it is done)."""

_OFF = "always False: zerolite does not build the feature (its config block loads, unused)"
ENGINE_NOTES: dict[str, str] = {
    "communication_data_type": "float32 when unset (DeepSpeed: the training dtype); setting "
                               "it is refused",
    "enable_backward_allreduce": "always True; setting it False is refused",
    "get_model_parallel_rank": "0 (DeepSpeed asserts without tensor-parallel groups)",
    "get_tensor_parallel_rank": "0 (DeepSpeed asserts without tensor-parallel groups)",
    "module_state_dict": "stages 0-2; refused under stage 3",
    "load_module_state_dict": "gathers and writes the masters at every stage",
    "deepspeed_io": "a torch DataLoader",
    "save_fp16_model": "default file name as save_16bit_model's",
    "zero_compute_grad_norm": "always True (zerolite always computes the norm)",
    "data_parallel_group": "the default (WORLD) group",
    "dist_backend": "the process group's backend",
    "managed_gradient_accumulation": "always True (the config key is not read)",
    "checkpoint_writer_enabled": _OFF,
    **{name: _OFF for name in (
        "flops_profiler_enabled", "autotuning_enabled", "autotuning_profile_model_info",
        "data_efficiency_enabled", "data_sampling_enabled", "curriculum_learning_enabled",
        "random_ltd_enabled", "is_deepcompile_enabled", "is_sanity_checks_enabled")},
}
"""Differences from DeepSpeed of names the engine provides."""

ENGINE = os.path.join(ROOT, "zerolite", "engine.py")
ENGINE_CLASS = "ZeroEngine"


def alias_module(module: str):
    name = ALIAS + module[len("deepspeed"):]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        parent, _, leaf = name.rpartition(".")
        return getattr(importlib.import_module(parent), leaf, None)


def is_refused(obj) -> bool:
    return (getattr(obj, "__doc__", None) or "").startswith("Refused:")


def classify(module: str, name: str, alias) -> tuple[str, str]:
    """(status, note) of one DeepSpeed name."""
    if alias is not None and hasattr(alias, name):
        obj = getattr(alias, name)
        if is_refused(obj):
            return "refused", obj.__doc__[len("Refused:"):].strip().rstrip(".")
        return "done", ""
    for pattern, why in INTERNAL.get(module, []):
        if re.fullmatch(pattern, name):
            return "internal", why
    if name in PENDING.get(module, {}):
        return "pending", PENDING[module][name]
    return "missing", ""


def engine_instance_attributes() -> set[str]:
    """Names ZeroEngine assigns as `self.<name>` (instance attributes, read from its source)."""
    tree = ast.parse(open(ENGINE, encoding="utf-8").read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ENGINE_CLASS)
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
            and n.value.id == "self"}


def engine_definition(name: str) -> tuple[bool, object]:
    """(whether one of zerolite's classes of the engine defines `name`, the definition);
    nn.Module's own names do not count."""
    from zerolite.engine import ZeroEngine

    for cls in ZeroEngine.__mro__:
        if name in vars(cls):
            return cls.__module__.startswith("zerolite"), vars(cls)[name]
    return False, None


def classify_engine(name: str, instance_attributes: set[str]) -> tuple[str, str]:
    """(status, note) of one DeepSpeedEngine name."""
    from zerolite.engine_accessors import REFUSED

    defined, definition = engine_definition(name)
    if defined and name in REFUSED and is_refused(definition):
        return "refused", REFUSED[name]
    if defined or name in instance_attributes:
        return "done", ENGINE_NOTES.get(name, "")
    for pattern, why in ENGINE_INTERNAL:
        if re.fullmatch(pattern, name):
            return "internal", why
    if name in ENGINE_PENDING:
        return "pending", ENGINE_PENDING[name]
    return "missing", ""


def engine_inventory() -> list[tuple[str, str, str, str]]:
    """[(name, kind, status, note)] of DeepSpeedEngine's public methods and attributes."""
    engine = json.load(open(NAMES, encoding="utf-8"))["engine"]
    names = {**engine["methods"], **{a: "attribute" for a in engine["attributes"]}}
    instance = engine_instance_attributes()
    return [(name, kind, *classify_engine(name, instance)) for name, kind in sorted(names.items())]


def inventory() -> tuple[str, dict[str, list]]:
    data = json.load(open(NAMES, encoding="utf-8"))
    rows = {}
    for module, names in data["modules"].items():
        alias = alias_module(module)
        rows[module] = [(name, kind, *classify(module, name, alias))
                        for name, kind in sorted(names.items())]
    return data["deepspeed_version"], rows


STATUSES = ("done", "refused", "internal", "pending", "missing")


def _counts(entries) -> str:
    return " | ".join(f"{s}: {sum(1 for x in entries if x[2] == s)}" for s in STATUSES)


def render() -> str:
    version, rows = inventory()
    engine = engine_inventory()
    out = [f"# DeepSpeed {version}'s public API in zerolite's alias", "",
           "Generated by `python tools/deepspeed_inventory.py` from `docs/deepspeed_names.json`",
           "(collected from the installed DeepSpeed by `tools/deepspeed_names.py`); do not edit.",
           "`tests/test_deepspeed_inventory.py` fails when a name is in none of the columns or",
           "this page is stale.", "",
           "**done**: the alias provides it (differences from DeepSpeed are in the alias "
           "modules' docstrings). **refused**: the alias has it and using it raises "
           "`DeepSpeedFeatureNotSupported` naming it. **internal**: DeepSpeed's own plumbing. "
           "**pending**: added by another open work item (named).", "",
           "Modules: " + _counts([x for r in rows.values() for x in r]) + ".", "",
           "Engine (`DeepSpeedEngine`, below): " + _counts(engine) + ".", ""]
    for module, entries in rows.items():
        out += [f"## `{module}`", "", "| name | kind | status | note |", "|---|---|---|---|"]
        out += [f"| `{n}` | {k} | {s} | {note} |" for n, k, s, note in entries]
        out.append("")
    out += ["## `DeepSpeedEngine` (what `deepspeed.initialize` returns)", "",
            "Its public methods (defined in the class, properties and static methods marked) and "
            "public instance attributes, against zerolite's engine (`zerolite/engine.py`, "
            "`zerolite/engine_accessors.py`). The note of a done name says how it differs "
            "from DeepSpeed's.", "",
            "| name | kind | status | note |", "|---|---|---|---|"]
    out += [f"| `{n}` | {k} | {s} | {note} |" for n, k, s, note in engine]
    out.append("")
    return "\n".join(out)


def main() -> None:
    text = render()
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    for line in text.splitlines():
        if line.startswith(("Modules: ", "Engine (")):
            print(line)


if __name__ == "__main__":
    sys.exit(main())
