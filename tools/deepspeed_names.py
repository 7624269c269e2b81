"""Collect DeepSpeed's public names, module by module, into docs/deepspeed_names.json, and
the public surface of its engine (DeepSpeedEngine, what `deepspeed.initialize` returns).

Run it with a Python where the real DeepSpeed is installed (a venv of its own: the project's
does not have it), from the repository root:

    DS_ACCELERATOR=cpu /path/to/ds-venv/bin/python tools/deepspeed_names.py

The engine's surface is read from DeepSpeed's source alone (no DeepSpeed import), so it can be
refreshed with any Python, from an installed DeepSpeed or an unpacked wheel, leaving the
module names as they are:

    python tools/deepspeed_names.py --engine-only [--source DIR]   # DIR holds deepspeed/

A module's public names are its `__all__` when it has one; otherwise every name without a
leading underscore that the module defines itself (def, class or assignment at top level of
its source) or, for a package's `__init__`, imports from inside DeepSpeed (a re-export).
Names a module merely imports for its own use (torch, typing, other DeepSpeed modules' helpers
in a plain module) are not its API. tools/deepspeed_inventory.py classifies the result
against zerolite's alias; tests/test_deepspeed_inventory.py keeps the two in step.

The engine's public methods are the functions defined in DeepSpeedEngine's class body without
a leading underscore (properties and static methods marked as such); its public attributes are
the names it assigns as `self.<name>` anywhere in the class, less those methods.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
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


ENGINE_FILE = os.path.join("runtime", "engine.py")
ENGINE_CLASS = "DeepSpeedEngine"


def _package_dir(source: str | None) -> str:
    """DeepSpeed's package directory: `source`/deepspeed (or `source` itself when it is the
    package), else the installed one, found without importing it."""
    if source is not None:
        for candidate in (os.path.join(source, "deepspeed"), source):
            if os.path.isfile(os.path.join(candidate, ENGINE_FILE)):
                return candidate
        raise SystemExit(f"--source {source}: no deepspeed/{ENGINE_FILE} there")
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("deepspeed is not installed here; pass --source DIR (an unpacked wheel)")
    return list(spec.submodule_search_locations)[0]


def _source_version(package_dir: str) -> str:
    """The version DeepSpeed's build recorded in git_version_info_installed.py, else the
    installed distribution's."""
    path = os.path.join(package_dir, "git_version_info_installed.py")
    if os.path.isfile(path):
        for node in ast.parse(open(path, encoding="utf-8").read()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "version" for t in node.targets):
                return ast.literal_eval(node.value)
    return importlib.metadata.version("deepspeed")


def _decorators(node) -> set[str]:
    return {d.id if isinstance(d, ast.Name) else d.attr for d in node.decorator_list
            if isinstance(d, (ast.Name, ast.Attribute))}


def engine_names(package_dir: str) -> dict:
    """{"methods": {name: "method" | "property" | "staticmethod"}, "attributes": [names]} of
    DeepSpeedEngine, from its source."""
    tree = ast.parse(open(os.path.join(package_dir, ENGINE_FILE), encoding="utf-8").read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ENGINE_CLASS)
    methods: dict[str, str] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and not node.name.startswith("_"):
            marks = _decorators(node)
            kind = ("property" if "property" in marks or "setter" in marks else
                    "staticmethod" if "staticmethod" in marks else "method")
            methods[node.name] = "property" if methods.get(node.name) == "property" else kind
    attributes = {n.attr for n in ast.walk(cls)
                  if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                  and isinstance(n.value, ast.Name) and n.value.id == "self"
                  and not n.attr.startswith("_")}
    return {"methods": dict(sorted(methods.items())),
            "attributes": sorted(attributes - set(methods))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-only", action="store_true",
                        help="refresh only the engine's names (no DeepSpeed import needed)")
    parser.add_argument("--source", metavar="DIR",
                        help="read DeepSpeed's source from DIR (holding deepspeed/) instead of "
                             "the installed package")
    args = parser.parse_args(argv)
    package_dir = _package_dir(args.source)
    version = _source_version(package_dir)
    if args.engine_only:
        out = json.load(open(OUT, encoding="utf-8"))
        if out["deepspeed_version"] != version:
            raise SystemExit(f"{package_dir} is DeepSpeed {version}, the module names are "
                             f"{out['deepspeed_version']}'s: refresh both (without "
                             "--engine-only, with that DeepSpeed installed)")
    else:
        import deepspeed

        if deepspeed.__version__ != version:
            raise SystemExit(f"the imported DeepSpeed ({deepspeed.__version__}) is not the one "
                             f"at {package_dir} ({version})")
        out = {"deepspeed_version": deepspeed.__version__,
               "modules": {m: public_names(m) for m in MODULES}}
    out["engine"] = engine_names(package_dir)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(len(v) for v in out["modules"].values())
    engine = out["engine"]
    print(f"{OUT}: {total} names in {len(MODULES)} modules; DeepSpeedEngine: "
          f"{len(engine['methods'])} methods, {len(engine['attributes'])} attributes "
          f"(DeepSpeed {version})")


if __name__ == "__main__":
    sys.exit(main())
