"""The global patching behind `zero.Init`: while any context is active, module construction
reports each finished module to the innermost context, and weight initialisation runs on
gathered values.

Every nn.Module subclass has its `__init__` wrapped. When the OUTERMOST `__init__` of a
module object returns (a subclass calling `super().__init__()` does not count), the active
context's `_partition_module(module)` is called. Peak memory while building is therefore the
partitioned model plus one module's full parameters.

[Note: parent-level initialisation] Children are partitioned before their parent's
`__init__` finishes, so a parent that re-initialises its children's weights (the usual
`self.apply(self._init_weights)`, or `nn.init.normal_(child.weight)`) would act on
empty tensors. As DeepSpeed does for `Module.apply`, we wrap `Module.apply` and the
`torch.nn.init` functions: a partitioned parameter is gathered for the call, the result is
broadcast from rank 0 and re-partitioned. The model then ends up bit-identical to one built
without the context from the same seed. Other writes (e.g. `p.data.copy_(...)` in a parent)
need `GatheredParameters(params, modifier_rank=0)`, as in DeepSpeed.

[Note: meta modules] A module built on the meta device (`torch.nn.utils.skip_init`, or
`device="meta"`) has nothing to partition when its `__init__` returns; `Module.to_empty` is
wrapped so the parameters are partitioned once it gives them storage.

A context is anything with `_depth: dict[int, int]` and `_partition_module(module)` (see
init.py); `activate` / `deactivate` patch on the first and restore on the last.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from zerolite.zero.gathered import GatheredParameters
from zerolite.zero.sliced_param import is_partitioned

_ACTIVE: list = []
"""Active contexts, innermost last."""
_PATCHED: dict = {}
"""What the outermost active context replaced: class -> original __init__, plus the rest."""

_INIT_FNS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
             "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
             "kaiming_normal_", "orthogonal_", "sparse_")


def activate(ctx) -> None:
    if not _ACTIVE:
        _patch_globals()
    _ACTIVE.append(ctx)


def deactivate(ctx) -> None:
    _ACTIVE.remove(ctx)
    if not _ACTIVE:
        _unpatch_globals()


def _current():
    return _ACTIVE[-1] if _ACTIVE else None


def _subclasses(cls):
    seen, todo = [], list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.append(c)
            todo.extend(c.__subclasses__())
    return seen


def _wrap_init(orig):
    @functools.wraps(orig)
    def wrapper(module, *args, **kwargs):
        ctx = _current()
        if ctx is None:
            return orig(module, *args, **kwargs)
        key = id(module)
        depth = ctx._depth.get(key, 0)
        ctx._depth[key] = depth + 1
        try:
            orig(module, *args, **kwargs)
        finally:
            if depth == 0:
                del ctx._depth[key]
            else:
                ctx._depth[key] = depth
        if depth == 0:
            ctx._partition_module(module)

    wrapper._zl_original_init = orig
    return wrapper


def _patch_class(cls) -> None:
    init = cls.__dict__.get("__init__")
    if init is None or cls in _PATCHED["classes"] or hasattr(init, "_zl_original_init"):
        return
    try:
        cls.__init__ = _wrap_init(init)
    except (TypeError, AttributeError):  # e.g. an extension type that refuses new attributes
        return
    _PATCHED["classes"][cls] = init


def _gathering_call(fn, params):
    """Call fn() with the partitioned `params` gathered; rank 0's result is kept."""
    params = [p for p in params if is_partitioned(p) and not p.zl_partitioned.gathered]
    if not params:
        return fn()
    with GatheredParameters(params, modifier_rank=0):
        return fn()


def _patch_globals() -> None:
    _PATCHED["classes"] = {}
    for cls in _subclasses(nn.Module):
        _patch_class(cls)
    _PATCHED["init_subclass"] = nn.Module.__dict__.get("__init_subclass__")

    def init_subclass(cls, **kwargs):
        super(nn.Module, cls).__init_subclass__(**kwargs)
        if _ACTIVE:
            _patch_class(cls)

    nn.Module.__init_subclass__ = classmethod(init_subclass)

    orig_apply = nn.Module.apply
    _PATCHED["apply"] = orig_apply

    def apply(self, fn):
        if getattr(fn, "_zl_gathering", False):  # children's apply: already wrapped
            return orig_apply(self, fn)

        @functools.wraps(fn)
        def gathered_fn(m):
            return _gathering_call(lambda: fn(m), m.parameters(recurse=False))
        gathered_fn._zl_gathering = True
        return orig_apply(self, gathered_fn)

    nn.Module.apply = apply

    orig_to_empty = nn.Module.to_empty
    _PATCHED["to_empty"] = orig_to_empty

    @functools.wraps(orig_to_empty)
    def to_empty(self, *args, **kwargs):
        result = orig_to_empty(self, *args, **kwargs)
        ctx = _current()
        if ctx is not None:  # meta parameters now have storage: partition them
            ctx._partition_module(self)
        return result

    nn.Module.to_empty = to_empty

    _PATCHED["init_fns"] = {}
    for name in _INIT_FNS:
        orig = getattr(torch.nn.init, name, None)
        if orig is None:
            continue
        _PATCHED["init_fns"][name] = orig

        def make(orig):
            @functools.wraps(orig)
            def init_fn(tensor, *args, **kwargs):
                if not is_partitioned(tensor) or tensor.zl_partitioned.gathered:
                    return orig(tensor, *args, **kwargs)
                _gathering_call(lambda: orig(tensor, *args, **kwargs), [tensor])
                return tensor
            return init_fn

        setattr(torch.nn.init, name, make(orig))


def _unpatch_globals() -> None:
    for cls, init in _PATCHED.pop("classes").items():
        cls.__init__ = init
    sub = _PATCHED.pop("init_subclass")
    if sub is None:
        del nn.Module.__init_subclass__
    else:
        nn.Module.__init_subclass__ = sub
    nn.Module.apply = _PATCHED.pop("apply")
    nn.Module.to_empty = _PATCHED.pop("to_empty")
    for name, fn in _PATCHED.pop("init_fns").items():
        setattr(torch.nn.init, name, fn)
