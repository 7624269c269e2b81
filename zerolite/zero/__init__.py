"""The sharding machinery, plus DeepSpeed's `deepspeed.zero` user API:

    zerolite.zero.Init                           partition parameters while building the model
    zerolite.zero.GatheredParameters             full values of sharded params for a block
    zerolite.zero.register_external_parameter    accepted; not needed (params gathered per unit)
    zerolite.zero.unregister_external_parameter

The names are resolved lazily, so `import zerolite.zero` (and the engine, which imports the
submodules) stays light. README.md in this folder draws the layers (each file imports only
from the ones below it).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Init": "zerolite.zero.init",
    "GatheredParameters": "zerolite.zero.gathered",
    "register_external_parameter": "zerolite.zero.gathered",
    "unregister_external_parameter": "zerolite.zero.gathered",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'zerolite.zero' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
