"""Python state (client_state, a scheduler's state_dict) as JSON plus tensors, exactly.

DeepSpeed pickles such state and hands it back as it was. A zerolite checkpoint stays data:
`encode` turns the state into a JSON tree and a list of tensors (stored in the rank's
safetensors file), and `decode` rebuilds it. Whatever plain JSON would change on the way
gets a tagged node, so it comes back with its type:

    {"__zerolite__": "tensor", "key": "3"}              a tensor (on CPU, as DeepSpeed loads it)
    {"__zerolite__": "tuple", "items": [...]}
    {"__zerolite__": "dict", "kind": K, "items": [[key, value], ...]}
        K is "dict", "OrderedDict" or "Counter"; used for an OrderedDict or Counter, and for
        a dict whose keys are not all strings (JSON would turn 3 into "3": MultiStepLR's
        milestones are a Counter of ints) or that has the "__zerolite__" key itself
    {"__zerolite__": "bytes", "hex": "..."}

[Note: what is refused] Anything else (a class instance, an Enum, a function, a defaultdict,
a sparse tensor, a dtype safetensors lacks) is refused by name and path before anything is
written. Loading such objects would need pickle, which a zerolite checkpoint never runs.
Numbers and strings come back as Python's int, float and str (a numpy float64 as a float).
Tensors lose `requires_grad`, any storage they shared, and their device.
"""
from __future__ import annotations

import enum
import numbers
from collections import Counter, OrderedDict
from collections.abc import Callable

import torch

from zerolite.checkpoint.st_io import STORABLE_DTYPES

MARK = "__zerolite__"
_DICT_KINDS = {dict: "dict", OrderedDict: "OrderedDict", Counter: "Counter"}
_DICT_TYPES = {v: k for k, v in _DICT_KINDS.items()}


def encode(value, where: str) -> tuple[object, list[torch.Tensor]]:
    """(JSON tree, tensors); tensor node i refers to tensors[i]. Raises TypeError naming the
    first value that cannot be stored, by its path from `where`."""
    tensors: list[torch.Tensor] = []
    return _encode(value, where, tensors), tensors


def _encode(v, where: str, tensors: list):
    if v is None or type(v) in (bool, int, float, str):
        return v
    if isinstance(v, numbers.Real) and not isinstance(v, enum.Enum):  # numpy scalars
        return int(v) if isinstance(v, numbers.Integral) else float(v)
    if isinstance(v, torch.Tensor):
        if v.layout != torch.strided:
            raise TypeError(f"{where} is a {v.layout} tensor; only dense tensors can be stored")
        if v.dtype not in STORABLE_DTYPES:
            raise TypeError(f"{where} is a tensor of dtype {v.dtype}, which a safetensors file "
                            "cannot hold")
        tensors.append(v.detach())
        return {MARK: "tensor", "key": str(len(tensors) - 1)}
    if type(v) is list:
        return [_encode(x, f"{where}[{i}]", tensors) for i, x in enumerate(v)]
    if type(v) is tuple:
        return {MARK: "tuple", "items": [_encode(x, f"{where}[{i}]", tensors)
                                         for i, x in enumerate(v)]}
    if type(v) in _DICT_KINDS:
        if type(v) is dict and MARK not in v and all(type(k) is str for k in v):
            return {k: _encode(x, f"{where}[{k!r}]", tensors) for k, x in v.items()}
        items = []
        for k, x in v.items():
            if isinstance(k, torch.Tensor):
                raise TypeError(f"{where} has a tensor as a key")
            items.append([_encode(k, f"{where} key {k!r}", tensors),
                          _encode(x, f"{where}[{k!r}]", tensors)])
        return {MARK: "dict", "kind": _DICT_KINDS[type(v)], "items": items}
    if type(v) is bytes:
        return {MARK: "bytes", "hex": v.hex()}
    raise TypeError(f"{where} is a {type(v).__module__}.{type(v).__qualname__}, which a "
                    "checkpoint cannot store as data (it would need pickle); store plain data "
                    "instead: numbers, strings, lists, tuples, dicts, tensors")


def decode(tree, read_tensor: Callable[[str], torch.Tensor]):
    """The value `encode` was given; read_tensor(key) returns the stored tensor `key`."""
    if isinstance(tree, list):
        return [decode(x, read_tensor) for x in tree]
    if not isinstance(tree, dict):
        return tree
    tag = tree.get(MARK)
    if tag is None:
        return {k: decode(x, read_tensor) for k, x in tree.items()}
    if tag == "tensor":
        return read_tensor(tree["key"])
    if tag == "tuple":
        return tuple(decode(x, read_tensor) for x in tree["items"])
    if tag == "dict":
        out = _DICT_TYPES[tree["kind"]]()  # filled by assignment: Counter(pairs) would count
        for k, x in tree["items"]:
            out[decode(k, read_tensor)] = decode(x, read_tensor)
        return out
    if tag == "bytes":
        return bytes.fromhex(tree["hex"])
    raise ValueError(f"unknown {MARK} node {tag!r} (written by a newer zerolite?)")


def has_tensors(tree) -> bool:
    if isinstance(tree, list):
        return any(has_tensors(x) for x in tree)
    if isinstance(tree, dict):
        return tree.get(MARK) == "tensor" or any(has_tensors(x) for x in tree.values())
    return False
