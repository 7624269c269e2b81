"""The sub-blocks of `zero_optimization`: the offload blocks and `leaf_module`."""

from __future__ import annotations

from typing import Any

from ._util import check_bool, check_float, check_int, check_object, check_str, fail, join


_OFFLOAD_COMMON = {"device": "none", "nvme_path": None, "pin_memory": False}
_OFFLOAD_DEFAULTS = {
    "offload_param": {**_OFFLOAD_COMMON, "buffer_count": 5, "buffer_size": 100_000_000,
                      "max_in_cpu": 1_000_000_000},
    "offload_optimizer": {**_OFFLOAD_COMMON, "buffer_count": 4, "pipeline_read": False,
                          "pipeline_write": False, "fast_init": False, "ratio": 1.0},
}


def parse_offload(path: str, name: str, v: Any) -> dict | None:
    """Validate an offload block; device "none" (or null) means no offload -> None."""
    if v is None:
        return None
    check_object(path, v)
    out = dict(_OFFLOAD_DEFAULTS[name])
    for key, value in v.items():
        kp = join(path, key)
        if key == "device":
            value = check_str(kp, value.lower() if isinstance(value, str) else value,
                              choices=("none", "cpu", "nvme"))
        elif key == "nvme_path":
            value = check_str(kp, value, none_ok=True)
        elif key in ("pin_memory", "pipeline_read", "pipeline_write", "fast_init", "pipeline"):
            value = check_bool(kp, value)
        elif key in ("buffer_count", "buffer_size", "max_in_cpu"):
            value = check_int(kp, value, ge=0)
        elif key == "ratio":
            value = check_float(kp, value, gt=0, le=1)
        out[key] = value
    if out["device"] == "none":
        return None
    if out["device"] == "nvme" and not out["nvme_path"]:
        fail(join(path, "nvme_path"), out["nvme_path"], "a directory path when device is 'nvme'")
    return out


DEFAULT_LEAF_MODULE_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)
"""DeepSpeed 0.19's default `leaf_module.classes` (its MoE blocks of Transformers)."""

_LEAF_KEYS = ("classes", "names", "name_suffixes")


def leaf_module_lists(path: str, v: dict) -> dict:
    """`classes` / `names` / `name_suffixes` as lists of strings (a lone string is a list of
    one; duplicates dropped, order kept), as DeepSpeed normalises them."""
    out = {}
    for key in _LEAF_KEYS:
        items = v.get(key, [])
        items = [items] if isinstance(items, str) else items
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            fail(join(path, key), items, "a list of strings")
        out[key] = list(dict.fromkeys(items))
    return out


def parse_leaf_module(path: str, v: Any) -> dict:
    """`zero_optimization.leaf_module`: which modules the engine marks as ZeRO-3 leaves."""
    v = {} if v is None else check_object(path, v)
    for key in v:
        if key not in _LEAF_KEYS:
            fail(join(path, key), v[key], f"one of the keys {list(_LEAF_KEYS)}")
    return leaf_module_lists(path, {"classes": list(DEFAULT_LEAF_MODULE_CLASSES), **v})
