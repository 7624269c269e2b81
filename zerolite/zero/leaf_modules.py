"""ZeRO-3 leaf modules: modules whose parameters are gathered all at once on entry instead of
sub-module by sub-module (DeepSpeed's `set_z3_leaf_modules`; for MoE blocks, whose experts
run in a data-dependent order, and for deeply nested small modules).

What a leaf changes in zerolite: unit selection (partition.py) never looks inside a leaf, and
a leaf with parameters that is not already inside a unit becomes a unit of its own, so its
whole subtree is one gather. A leaf inside a unit is gathered whole with its unit already.
Marks are read when an engine is built: mark before `initialize`, as with DeepSpeed.

The flag is DeepSpeed's own attribute, `module._z3_leaf`; the engine also sets
`param.ds_z3_leaf_module` on each leaf's parameters, as DeepSpeed's does.
"""
from __future__ import annotations

import logging

import torch.nn as nn

logger = logging.getLogger("zerolite")


def z3_leaf_module(module: nn.Module) -> bool:
    """Is `module` flagged as a leaf?"""
    return bool(getattr(module, "_z3_leaf", False))


def z3_leaf_parameter(param) -> bool:
    """Does `param` belong to a leaf module (as an engine recorded it)?"""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if z3_leaf_module(m)]


def set_z3_leaf_module(model: nn.Module, flag: bool) -> None:
    model._z3_leaf = flag


def _qualified(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(module: nn.Module, wanted) -> bool:
    """A class (instances of subclasses match too) or a name: the class's own name or its
    fully-qualified `module.QualName`."""
    if isinstance(wanted, type):
        return isinstance(module, wanted)
    return type(module).__name__ == wanted or _qualified(module) == wanted


def _flag_classes(model, classes, flag: bool, raise_if_not_found: bool) -> list[nn.Module]:
    classes = list(classes)
    bad = [c for c in classes if not isinstance(c, (type, str))]
    if bad:
        raise AssertionError(f"leaf_module_classes must be a list of types or names, got "
                             f"{classes} ({bad} is neither)")
    found = [m for m in model.modules() if any(_matches(m, c) for c in classes)]
    for m in found:
        m._z3_leaf = flag
    if not found and raise_if_not_found:
        raise ValueError(f"No modules of type {classes} found in model {type(model).__name__} "
                         "(classes match subclasses; names match the class name or "
                         "'package.module.ClassName')")
    return found


def set_z3_leaf_modules(model: nn.Module, leaf_module_classes,
                        raise_if_not_found: bool = True) -> list[nn.Module]:
    """Flag every module of these classes (types or names) as a leaf; returns them."""
    return _flag_classes(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: nn.Module, leaf_module_classes,
                          raise_if_not_found: bool = True) -> list[nn.Module]:
    return _flag_classes(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_modules_by_name(model: nn.Module, module_names, flag: bool = True,
                                raise_if_not_found: bool = True):
    """Flag the modules named (as `named_modules()` names them). Returns (modules, missing)."""
    by_name = dict(model.named_modules())
    found, missing = [], []
    for name in module_names:
        if name in by_name:
            by_name[name]._z3_leaf = flag
            found.append(by_name[name])
        else:
            missing.append(name)
    if missing and raise_if_not_found:
        raise ValueError(f"No modules named {missing} found in model {type(model).__name__}")
    return found, missing


def set_z3_leaf_modules_by_suffix(model: nn.Module, module_name_suffixes, flag: bool = True,
                                  raise_if_not_found: bool = True):
    """Flag every module whose name ends with one of the suffixes. Returns (modules, the
    suffixes that matched nothing)."""
    found, seen, missing = [], set(), []
    named = list(model.named_modules())
    for suffix in module_name_suffixes:
        hits = [m for name, m in named if name.endswith(suffix)]
        for m in hits:
            m._z3_leaf = flag
            if id(m) not in seen:
                seen.add(id(m))
                found.append(m)
        if not hits:
            missing.append(suffix)
    if missing and raise_if_not_found:
        raise ValueError(f"No modules matching suffixes {missing} found in model "
                         f"{type(model).__name__}")
    return found, missing


def apply_leaf_module_config(model: nn.Module, cfg: dict | None,
                             default_classes=()) -> list[nn.Module]:
    """`zero_optimization.leaf_module` ({classes, names, name_suffixes}, validated by the
    config): flag what it names. Unmatched names and suffixes given by the user are warned
    about; unmatched default classes (DeepSpeed's MoE blocks) are not."""
    if not cfg:
        return []
    found = set_z3_leaf_modules(model, cfg["classes"], raise_if_not_found=False)
    named, missing_names = set_z3_leaf_modules_by_name(model, cfg["names"],
                                                       raise_if_not_found=False)
    suffixed, missing_suffixes = set_z3_leaf_modules_by_suffix(model, cfg["name_suffixes"],
                                                               raise_if_not_found=False)
    if missing_names:
        logger.warning("zero_optimization.leaf_module.names: no module named %s", missing_names)
    if missing_suffixes:
        logger.warning("zero_optimization.leaf_module.name_suffixes: no module name ends with "
                       "%s", missing_suffixes)
    out = list({id(m): m for m in [*found, *named, *suffixed]}.values())
    custom = list(cfg["classes"]) != list(default_classes) or cfg["names"] or cfg["name_suffixes"]
    if not out and custom:
        logger.warning("zero_optimization.leaf_module matched no module; units are chosen as "
                       "usual")
    return out


def tag_leaf_parameters(model: nn.Module) -> None:
    """`param.ds_z3_leaf_module` on each leaf's parameters (DeepSpeed sets it at engine build)."""
    for leaf in get_z3_leaf_modules(model):
        for p in leaf.parameters():
            p.ds_z3_leaf_module = leaf
