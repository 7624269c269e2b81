"""Decide which modules become units and which parameters each unit owns.

Default policy: each child of an nn.ModuleList / nn.Sequential becomes a unit (outermost
containers only); everything else belongs to the root unit. Under any policy, a ZeRO-3 leaf
module (leaf_modules.py) met on the way down is a unit and is not looked into. A parameter
reached from more than one unit (a tied weight) belongs to the root unit, the lowest common
ancestor here.

At stage 3 the parameters DeepSpeed keeps persistent (`persistent_params`) leave their units
for one persistent unit, the last (`split_persistent`); a non-root unit left without
parameters is dropped.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch.nn as nn

from zerolite.zero.leaf_modules import z3_leaf_module
from zerolite.zero.sliced_param import full_shape

UnitPolicy = Callable[[str, nn.Module], bool]


def policy_from_classes(class_names: Iterable[str | type]) -> UnitPolicy:
    wanted = {c if isinstance(c, str) else c.__name__ for c in class_names}
    return lambda name, module: type(module).__name__ in wanted


def _default_unit_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    found: list[tuple[str, nn.Module]] = []

    def walk(prefix: str, module: nn.Module):
        for child_name, child in module.named_children():
            name = f"{prefix}{child_name}"
            if isinstance(module, (nn.ModuleList, nn.Sequential)) or z3_leaf_module(child):
                found.append((name, child))
            else:
                walk(name + ".", child)

    walk("", root)
    return found


def find_unit_modules(root: nn.Module, policy: UnitPolicy | None) -> list[tuple[str, nn.Module]]:
    """(name, module) of every non-root unit, in registration order."""
    if z3_leaf_module(root):
        return []  # the whole model is one leaf: one unit
    if policy is None:
        candidates = _default_unit_modules(root)
    else:
        candidates = []

        def walk(prefix: str, module: nn.Module):
            for child_name, child in module.named_children():
                name = f"{prefix}{child_name}"
                if z3_leaf_module(child) or policy(name, child):
                    candidates.append((name, child))
                else:
                    walk(name + ".", child)

        walk("", root)
    return [(n, m) for n, m in candidates if any(True for _ in m.parameters())]


def assign_params(root: nn.Module, unit_modules: list[tuple[str, nn.Module]]):
    """Map each parameter to its unit index (0 = root, i+1 = unit_modules[i]).

    Returns (param -> unit index, param -> all of its names), params in model order.
    """
    names: dict[nn.Parameter, list[str]] = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        names.setdefault(p, []).append(name)
    owner: dict[nn.Parameter, int] = {}
    for i, (_, module) in enumerate(unit_modules, start=1):
        for p in module.parameters():
            owner[p] = 0 if p in owner and owner[p] != i else i
    for p, pnames in names.items():
        if p not in owner:
            owner[p] = 0
            continue
        prefix = unit_modules[owner[p] - 1][0] + "."
        if any(not n.startswith(prefix) for n in pnames):
            owner[p] = 0  # also reached from outside its unit: tied across units
    return owner, {p: tuple(n) for p, n in names.items()}


def persistent_params(root: nn.Module, param_threshold: int, model_threshold: int
                      ) -> set[nn.Parameter]:
    """DeepSpeed's persistent parameters (`ds_persist`): in `named_parameters()` order, each
    one with at most `param_threshold` elements, while their total stays within
    `model_threshold` (a parameter that would exceed it is skipped, later smaller ones may
    still fit)."""
    chosen, total = set(), 0
    for _, p in root.named_parameters():
        numel = full_shape(p).numel()  # a zero.Init parameter's own shape is (0,)
        if numel + total > model_threshold:
            continue
        if numel <= param_threshold:
            chosen.add(p)
            total += numel
    return chosen


def split_persistent(unit_modules: list[tuple[str, nn.Module]], owner: dict[nn.Parameter, int],
                     persistent: set[nn.Parameter]):
    """Move the `persistent` parameters to a unit of their own, after every other unit, and
    drop the non-root units left without parameters. Returns (unit_modules kept, param ->
    unit index, persistent unit index or None)."""
    if not persistent:
        return unit_modules, owner, None
    left = {i for p, i in owner.items() if p not in persistent}
    kept = [i for i in range(1, len(unit_modules) + 1) if i in left]
    renumber = {0: 0, **{old: new for new, old in enumerate(kept, start=1)}}
    persistent_index = len(kept) + 1
    new_owner = {p: persistent_index if p in persistent else renumber[i]
                 for p, i in owner.items()}
    return [unit_modules[i - 1] for i in kept], new_owner, persistent_index
