"""Collect DeepSpeed's public names, module by module, into docs/deepspeed_names.json.

Run it with a Python where the real DeepSpeed is installed (a venv of its own: the project's
does not have it), from the repository root:

    DS_ACCELERATOR=cpu /path/to/ds-venv/bin/python tools/deepspeed_names.py

A module's public names are its `__all__` when it has one; otherwise every name without a
leading underscore that the module defines itself (def, class or assignment at top level of
its source) or, for a package's `__init__`, imports from inside DeepSpeed (a re-export).
Names a module merely imports for its own use (torch, typing, other DeepSpeed modules' helpers
in a plain module) are not its API. tools/deepspeed_inventory.py classifies the result
against zerolite's alias; tests/test_deepspeed_inventory.py keeps the two in step.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import sys
import types

MODULES = [
    "deepspeed", "deepspeed.zero", "deepspeed.utils", "deepspeed.runtime.config",
    "deepspeed.runtime.config_utils", "deepspeed.runtime.zero.config",
    "deepspeed.runtime.zero.offload_config", "deepspeed.runtime.zero.leaf_module_config",
    "deepspeed.runtime.zero.partition_parameters", "deepspeed.runtime.lr_schedules",
    "deepspeed.checkpoint", "deepspeed.ops.adam", "deepspeed.ops.adagrad", "deepspeed.ops.lamb",
    "deepspeed.ops.lion", "deepspeed.accelerator", "deepspeed.comm",
]
"""The modules issue 23 names: DeepSpeed's documented public API surface."""

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "deepspeed_names.json")


def _top_level(path: str, package: str) -> tuple[set, set]:
    """(names defined at top level, names imported from inside DeepSpeed) of a source file;
    `from .x import *` brings in x's own public names."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    defined, reexported = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defined.add(n.id)
        elif isinstance(node, ast.ImportFrom) and (node.level or
                                                   (node.module or "").startswith("deepspeed")):
            reexported.update(a.asname or a.name for a in node.names if a.name != "*")
            if any(a.name == "*" for a in node.names):
                source = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                     package) if node.level else node.module
                reexported.update(public_names(source))
    return defined, reexported


def _kind(value) -> str:
    if isinstance(value, types.ModuleType):
        return "module"
    if inspect.isclass(value):
        return "class"
    if callable(value):
        return "function"
    return "constant"


def _module(name: str):
    """The module by import, or as an attribute of its parent (`deepspeed.zero` is
    `deepspeed.runtime.zero` bound in `deepspeed`, not an importable path)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        parent, _, leaf = name.rpartition(".")
        return getattr(importlib.import_module(parent), leaf)


def public_names(module_name: str) -> dict[str, str]:
    mod = _module(module_name)
    names = getattr(mod, "__all__", None)
    if names is None:
        path = getattr(mod, "__file__", None) or ""
        package = mod.__name__ if path.endswith("__init__.py") else mod.__name__.rpartition(".")[0]
        defined, reexported = (_top_level(path, package) if path.endswith(".py")
                               else (set(), set()))
        keep = defined | (reexported if path.endswith("__init__.py") else set())
        names = [n for n in dir(mod) if not n.startswith("_") and n in keep]
    return {n: _kind(getattr(mod, n)) for n in sorted(set(names)) if hasattr(mod, n)}


def main() -> None:
    import deepspeed

    out = {"deepspeed_version": deepspeed.__version__,
           "modules": {m: public_names(m) for m in MODULES}}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(len(v) for v in out["modules"].values())
    print(f"{OUT}: {total} names in {len(MODULES)} modules (DeepSpeed {deepspeed.__version__})")


if __name__ == "__main__":
    sys.exit(main())
