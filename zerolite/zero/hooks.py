"""Module and autograd hooks that drive units through forward and backward.

forward pre-hook   -> gather the unit (wait for a prefetch if one is in flight)
forward post-hook  -> stage 3: release it again (not during a recompute in backward);
                      register a "pre-backward" hook on its outputs (re-gather before its
                      backward) and a "post-backward" hook on its inputs (backward done)
param grad hook    -> move the grad into the unit's flat grad buffer; when every param of
                      the flat has reported, reduce-scatter it (asynchronously)
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves

from zerolite.zero.flat_param import FlatParam
from zerolite.zero.unit import Unit


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

    def before_unit_backward(self, unit: Unit) -> None: ...

    def after_unit_backward(self, unit: Unit) -> None: ...

    def on_param_grad(self, unit: Unit, flat: FlatParam, index: int) -> None: ...


def _grad_tensors(obj) -> list[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor) and t.requires_grad]


def install_hooks(model: UnitEvents) -> list:
    handles = []
    for unit in model.units:
        handles.append(unit.module.register_forward_pre_hook(
            _make_pre_forward(model, unit), with_kwargs=True))
        handles.append(unit.module.register_forward_hook(
            _make_post_forward(model, unit), with_kwargs=True))
        for flat in unit.trainable_flats:
            for i, p in enumerate(flat.params):
                handles.append(p.register_post_accumulate_grad_hook(
                    _make_grad_hook(model, unit, flat, i)))
    return handles


def _make_pre_forward(model: UnitEvents, unit: Unit):
    def hook(module, args, kwargs):
        model.before_unit_forward(unit)
        inputs = _grad_tensors((args, kwargs))
        # Not during a recompute inside backward (activation checkpointing): those inputs'
        # grads may never be computed, and the unit is released by its original hooks.
        if inputs and torch.is_grad_enabled() and not unit.is_root and not model.in_backward:
            unit.pending_input_grads += 1
            register_multi_grad_hook(inputs, lambda grads: model.after_unit_backward(unit))
        return None

    return hook


def _make_post_forward(model: UnitEvents, unit: Unit):
    def hook(module, args, kwargs, output):
        outputs = _grad_tensors(output)
        if outputs and torch.is_grad_enabled() and not model.in_backward:
            register_multi_grad_hook(outputs, lambda grads: model.before_unit_backward(unit),
                                     mode="any")
        model.after_unit_forward(unit, needs_backward=bool(outputs) and torch.is_grad_enabled())
        return None

    return hook


def _make_grad_hook(model: UnitEvents, unit: Unit, flat: FlatParam, index: int):
    def hook(param):
        model.on_param_grad(unit, flat, index)

    return hook
