"""The sub-blocks of `zero_optimization`: the offload blocks and `leaf_module`."""

from __future__ import annotations

from typing import Any

from .offload import parse_offload  # noqa: F401  (the offload blocks: offload.py)
from ._util import check_object, fail, join


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
