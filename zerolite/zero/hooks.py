"""Module and autograd hooks that drive units through forward and backward.

Per unit, four module hooks (install_unit_hooks; module_hooks.py owns their handles):
  forward pre-hook   -> gather the unit (wait for a prefetch if one is in flight)
  forward post-hook  -> stage 3: release it again (not during a recompute in backward)
  "backward" hooks   -> armed in forward: a "pre-backward" hook on the unit's outputs
                        (re-gather before its backward) and a "post-backward" hook on its
                        inputs (its backward is done)
and two on every module inside the unit that owns some of its parameters directly:
  direct-call hooks  -> called outside the unit's own forward (DeepSpeed gathers module by
                        module, so programs call an embedding or a value head on its own):
                        gather the unit before, release it after unless backward needs it
The persistent unit (stage 3, residency.py) has no forward of its own, and every gather of
another unit gathers it too if it is not: one pre-hook on each module holding only persistent
parameters itself (a norm; a Linear whose weight is a block's has the block's direct-call
hooks) gathers it if it is not (a module called outside every unit's forward, before the
first step or after empty_partition_cache).
Per parameter (install_grad_hooks; the sharded model owns them):
  grad arrival hook  -> before autograd accumulates it: make sure the unit is gathered (a
                        param used outside its unit's forward, e.g. read at the root level
                        inside GatheredParameters, gets its grad while released)
  param grad hook    -> move the grad into the unit's flat grad buffer; when every param of
                        the flat has reported, reduce-scatter it (asynchronously)
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves

from zerolite.zero.flat_param import FlatParam
from zerolite.zero.unit import Unit, UnitState


class UnitEvents(Protocol):
    """What the hooks report to: the lifecycle owner of the units (ShardedModel).

    Note: declared here, below ShardedModel, so the hooks need not import the model that
    installs them (that was an import circle, type-only or not).
    """

    units: list[Unit]
    in_backward: bool
    """True from the first backward event until the end of backward."""

    def before_unit_forward(self, unit: Unit) -> None: ...

    def after_unit_forward(self, unit: Unit, needs_backward: bool) -> None: ...

    def before_direct_call(self, unit: Unit) -> None: ...

    def before_persistent_use(self) -> None: ...

    def after_direct_call(self, unit: Unit, output) -> None: ...

    def before_unit_backward(self, unit: Unit) -> None: ...

    def after_unit_backward(self, unit: Unit) -> None: ...

    def before_param_grad(self, unit: Unit) -> None: ...

    def on_param_grad(self, unit: Unit, flat: FlatParam, index: int) -> None: ...


def grad_tensors(obj) -> list[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor) and t.requires_grad]


def install_grad_hooks(model: UnitEvents) -> list:
    """The per-parameter gradient hooks of every unit (owned by the sharded model, as
    DeepSpeed's optimizer owns its reduce hooks)."""
    handles = []
    for unit in model.units:
        for flat in unit.trainable_flats:
            for i, p in enumerate(flat.params):
                handles.append(p.register_hook(_make_grad_arrival(model, unit)))
                handles.append(p.register_post_accumulate_grad_hook(
                    _make_grad_hook(model, unit, flat, i)))
    return handles


def install_unit_hooks(model: UnitEvents, unit: Unit) -> tuple[list, list]:
    """One unit's module hooks, split as DeepSpeed splits them: (forward hooks: gather before
    the forward, release after it; backward hooks: arm the re-gather before the unit's
    backward and the release after it). Registered in this order: forward pre-hook, the
    backward pre-hook, the backward post-hook, the forward post-hook. The persistent unit: its
    use pre-hooks only (as forward hooks; no backward ones)."""
    if unit.persistent:
        mine = {id(p) for flat in unit.flats for p in flat.params}
        return [owner.register_forward_pre_hook(_make_pre_persistent_use(model, unit))
                for owner in owner_submodules(unit)
                if all(id(p) in mine for p in owner.parameters(recurse=False))], []
    module = unit.module
    fwd_pre = module.register_forward_pre_hook(_make_pre_forward(model, unit))
    bwd_pre = module.register_forward_pre_hook(_make_arm_post_backward(model, unit),
                                               with_kwargs=True)
    bwd_post = module.register_forward_hook(_make_arm_pre_backward(model, unit))
    fwd_post = module.register_forward_hook(_make_post_forward(model, unit))
    direct = []
    for owner in owner_submodules(unit):
        direct.append(owner.register_forward_pre_hook(_make_pre_direct_call(model, unit)))
        direct.append(owner.register_forward_hook(_make_post_direct_call(model, unit)))
    return [fwd_pre, fwd_post, *direct], [bwd_pre, bwd_post]


# [Note: hooks under torch.compile] engine.compile compiles the model's forward. The unit
# hooks gather, release and register autograd hooks: they stay eager (a graph break around each
# unit, so each unit's forward compiles on its own, as DeepSpeed keeps its fetch eager). The
# direct-call hooks are skipped while compiling (a module called on its own inside a compiled
# forward finds its unit gathered by the unit's hooks; called outside, it is run eagerly).
_eager = torch.compiler.disable


def owner_submodules(unit: Unit) -> list[torch.nn.Module]:
    """The modules below the unit's module that hold some of its parameters themselves (not
    through a child): the ones a program can call without the unit's module running."""
    mine = {id(p) for flat in unit.flats for p in flat.params}
    return [m for m in unit.module.modules() if m is not unit.module
            and any(id(p) in mine for p in m.parameters(recurse=False))]


def _make_pre_forward(model: UnitEvents, unit: Unit):
    @_eager
    def hook(module, args):
        model.before_unit_forward(unit)

    return hook


def _make_arm_post_backward(model: UnitEvents, unit: Unit):
    @_eager
    def hook(module, args, kwargs):
        inputs = grad_tensors((args, kwargs))
        # Not during a recompute inside backward (activation checkpointing): those inputs'
        # grads may never be computed, and the unit is released by its original hooks.
        if inputs and torch.is_grad_enabled() and not unit.is_root and not model.in_backward:
            unit.pending_input_grads += 1
            register_multi_grad_hook(inputs, lambda grads: model.after_unit_backward(unit))
        return None

    return hook


def _make_arm_pre_backward(model: UnitEvents, unit: Unit):
    @_eager
    def hook(module, args, output):
        outputs = grad_tensors(output)
        if outputs and torch.is_grad_enabled() and not model.in_backward:
            register_multi_grad_hook(outputs, lambda grads: model.before_unit_backward(unit),
                                     mode="any")
        return None

    return hook


def _make_post_forward(model: UnitEvents, unit: Unit):
    @_eager
    def hook(module, args, output):
        needs_backward = torch.is_grad_enabled() and bool(grad_tensors(output))
        model.after_unit_forward(unit, needs_backward=needs_backward)
        return None

    return hook


def _make_pre_direct_call(model: UnitEvents, unit: Unit):
    def hook(module, args):
        if not torch.compiler.is_compiling():
            model.before_direct_call(unit)

    return hook


def _make_pre_persistent_use(model: UnitEvents, unit: Unit):
    def hook(module, args):
        if unit.state is not UnitState.GATHERED and not torch.compiler.is_compiling():
            model.before_persistent_use()

    return hook


def _make_post_direct_call(model: UnitEvents, unit: Unit):
    def hook(module, args, output):
        if unit.direct_calls and not torch.compiler.is_compiling():
            model.after_direct_call(unit, output)
        return None

    return hook


def _make_grad_arrival(model: UnitEvents, unit: Unit):
    def hook(grad):
        model.before_param_grad(unit)
        return None

    return hook


def _make_grad_hook(model: UnitEvents, unit: Unit, flat: FlatParam, index: int):
    def hook(param):
        model.on_param_grad(unit, flat, index)

    return hook
