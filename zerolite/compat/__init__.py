"""DeepSpeed as a namespace: run unchanged DeepSpeed programs on zerolite.

    zerolite --as-deepspeed --num_procs 2 train.py --deepspeed --deepspeed_config ds.json
    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed train.py ...

The `deepspeed` modules programs import (`deepspeed.accelerator`, `deepspeed.comm`,
`deepspeed.ops.adam`, `deepspeed.runtime.…`) are thin forwarders in
`zerolite/compat/deepspeed/` over zerolite's own API. They become `import deepspeed` only in
processes started through one of the entry points above, which put `SITE_DIR` first on
`sys.path` and `PYTHONPATH`.

[Note: a site directory, not a sys.modules alias] `SITE_DIR` holds a `deepspeed` package and a
`deepspeed-<version>.dist-info`. Libraries find DeepSpeed with `importlib.util.find_spec` AND
`importlib.metadata` (Transformers, Accelerate) and check its version; a directory on
PYTHONPATH answers both, precedes site-packages (so it wins over an installed DeepSpeed only in
those processes) and is inherited by spawned children such as dataloader workers.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys

DEEPSPEED_API_VERSION = "0.19.8"
"""The DeepSpeed release whose API the forwarders follow (what importlib.metadata reports)."""

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
"""Directory to put first on sys.path/PYTHONPATH to make `import deepspeed` mean zerolite."""

MARKER = "zerolite"
"""`importlib.metadata.metadata("deepspeed")["Provides-Alias-Of"]` in the alias."""

BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
"""DeepSpeed's commands (`deepspeed`) for the alias, put first on PATH with SITE_DIR: launchers
that build a `deepspeed ...` command line (Accelerate, multi-node) reach zerolite's launcher."""

ENV_FLAG = "ZEROLITE_AS_DEEPSPEED"
"""Set to "1" in processes started as DeepSpeed (read by `zerolite report`)."""

PYTHON_ENV = "ZEROLITE_PYTHON"
"""The interpreter BIN_DIR's commands run (this one: the alias lives in its environment)."""


def _first(value: str, entry: str) -> str:
    return os.pathsep.join([entry, *(p for p in value.split(os.pathsep) if p and p != entry)])


def alias_env(env: dict) -> dict:
    """`env` with the alias active: SITE_DIR first on PYTHONPATH and BIN_DIR first on PATH
    (once each), ENV_FLAG and PYTHON_ENV set."""
    out = dict(env)
    out["PYTHONPATH"] = _first(env.get("PYTHONPATH", ""), SITE_DIR)
    out["PATH"] = _first(env.get("PATH", os.defpath), BIN_DIR)
    out[ENV_FLAG] = "1"
    out.setdefault(PYTHON_ENV, sys.executable)
    return out


def which_deepspeed() -> str:
    """Which `deepspeed` this process would import, in one line (for `zerolite report`)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None:
        return "none (not installed; `zerolite --as-deepspeed` provides zerolite's alias)"
    where = spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]
    try:
        meta = importlib.metadata.metadata("deepspeed")
        version = meta.get("Version", "unknown")
        alias = meta.get("Provides-Alias-Of") == MARKER
    except importlib.metadata.PackageNotFoundError:
        version, alias = "unknown (no distribution metadata)", False
    kind = "zerolite's DeepSpeed alias" if alias else "DeepSpeed"
    return f"{kind} {version} ({os.path.dirname(where)})"
