"""DeepSpeed's public API against zerolite's alias: every name of docs/deepspeed_names.json
(collected from the real DeepSpeed by tools/deepspeed_names.py) marked

    done      the alias provides it (differences from DeepSpeed: the alias modules' docstrings)
    refused   the alias has it, and using it raises DeepSpeedFeatureNotSupported naming it
    internal  DeepSpeed's own plumbing, not something programs call; INTERNAL says why
    pending   added by another open work item, listed by name in PENDING

and rendered as docs/deepspeed_api.md. tests/test_deepspeed_inventory.py fails when a name is
in none of the three, or when the committed page differs from what this renders.

    python tools/deepspeed_inventory.py          # rewrite docs/deepspeed_api.md
"""
from __future__ import annotations

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


def inventory() -> tuple[str, dict[str, list]]:
    data = json.load(open(NAMES, encoding="utf-8"))
    rows = {}
    for module, names in data["modules"].items():
        alias = alias_module(module)
        rows[module] = [(name, kind, *classify(module, name, alias))
                        for name, kind in sorted(names.items())]
    return data["deepspeed_version"], rows


def render() -> str:
    version, rows = inventory()
    counts = {s: sum(1 for r in rows.values() for x in r if x[2] == s)
              for s in ("done", "refused", "internal", "pending", "missing")}
    out = [f"# DeepSpeed {version}'s public API in zerolite's alias", "",
           "Generated by `python tools/deepspeed_inventory.py` from `docs/deepspeed_names.json`",
           "(collected from the installed DeepSpeed by `tools/deepspeed_names.py`); do not edit.",
           "`tests/test_deepspeed_inventory.py` fails when a name is in none of the columns or",
           "this page is stale.", "",
           "**done**: the alias provides it (differences from DeepSpeed are in the alias "
           "modules' docstrings). **refused**: the alias has it and using it raises "
           "`DeepSpeedFeatureNotSupported` naming it. **internal**: DeepSpeed's own plumbing. "
           "**pending**: added by another open work item (named).", "",
           " | ".join(f"{s}: {n}" for s, n in counts.items()), ""]
    for module, entries in rows.items():
        out += [f"## `{module}`", "", "| name | kind | status | note |", "|---|---|---|---|"]
        out += [f"| `{n}` | {k} | {s} | {note} |" for n, k, s, note in entries]
        out.append("")
    return "\n".join(out)


def main() -> None:
    text = render()
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    print(next(line for line in text.splitlines() if line.startswith("done:")))


if __name__ == "__main__":
    sys.exit(main())
