"""DeepSpeed's stage-3 hook surface, over zerolite's units: `engine.optimizer.parameter_offload`.

DeepSpeed's ZeRO-3 optimizer holds a `DeepSpeedZeRoOffload` (`.parameter_offload`) that owns
the module hooks gathering and releasing parameters, and a `PartitionedParameterCoordinator`
(`.param_coordinator`) that records the order modules run in ("the trace") to prefetch from.
Clients reach into both; TRL's generation under ZeRO-3 (trl/models/utils.py) does:

    with GatheredParameters(model.parameters()):          # every unit gathered
        p.ds_active_sub_modules.clear()  for every param
        h.remove()  for h in offload.forward_hooks + offload.backward_hooks
        offload.forward_hooks = offload.backward_hooks = []
        model.generate(...)                               # no zerolite hook fires
        if not offload.param_coordinator.is_invalid_trace():
            offload.param_coordinator._invalidate_trace()
        offload._register_deepspeed_module(offload.module)   # hooks back

Here the same names act on zerolite's own machinery: `ParameterOffload` owns each unit's four
module hooks (hooks.py; two "forward" hooks that gather and release, two "backward" hooks that
arm the backward re-gather and release) and `ParamCoordinator` answers for the Residency and
its PrefetchScheduler, whose recorded unit orders are the trace. The parameter gradient hooks
stay with the sharded model (in DeepSpeed they belong to the optimizer, which TRL leaves
alone). Unlike DeepSpeed, registering a module whose units are already hooked does not hook
them twice.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch.nn as nn

from zerolite.errors import ZeroliteConfigError, ZeroliteStateError
from zerolite.zero.hooks import UnitEvents, install_unit_hooks


class _NoExternalParameters:
    """`module.ds_external_parameters()`: DeepSpeed lists the parameters registered with
    `register_external_parameter` (as (key, param) pairs); zerolite gathers per unit and needs
    none (gathered.py), so the list is always empty. A plain object, not a bound method, so a
    module that carries it still pickles and deep-copies."""

    def __call__(self) -> tuple:
        return ()


_NO_EXTERNAL = _NoExternalParameters()


class UnitHookHandle:
    """One of a unit's module hooks; `remove()` removes it from the module (as torch's handle)."""

    __slots__ = ("unit_index", "_handle", "removed")

    def __init__(self, unit_index: int, handle):
        self.unit_index = unit_index
        self._handle = handle
        self.removed = False

    def remove(self) -> None:
        self._handle.remove()
        self.removed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class ParamCoordinator:
    """DeepSpeed's PartitionedParameterCoordinator trace questions, over the recorded orders.

    The trace is "complete" while some phase (forward, backward, forward without grad) has a
    recorded order to prefetch from, "record" while the first order is being seen, "invalid"
    when there is neither (a new engine, or after `_invalidate_trace`).
    """

    def __init__(self, residency):
        self._residency = residency

    @property
    def _phases(self):
        return self._residency.scheduler.phases

    def is_complete_trace(self) -> bool:
        return self._residency.scheduler.trace_complete()

    def is_record_trace(self) -> bool:
        return not self.is_complete_trace() and any(phase.current for phase in self._phases)

    def is_invalid_trace(self) -> bool:
        return not self.is_complete_trace() and not self.is_record_trace()

    def _invalidate_trace(self) -> None:
        """Forget the recorded orders (the next step gathers on demand and records again) and
        settle the prefetches in flight. Raises if the trace is already invalid, as DeepSpeed
        does; callers check `is_invalid_trace()` first."""
        if self.is_invalid_trace():
            raise ZeroliteStateError("attempted to invalidate an already invalid trace "
                                     "(check param_coordinator.is_invalid_trace() first)")
        self._residency.scheduler.forget()
        self._residency.settle_inflight()

    def release_and_reset_all(self, module=None) -> None:
        """Release every unit at stage 3, the persistent one too, as DeepSpeed does (the
        `module` argument is DeepSpeed's; zerolite's coordinator serves one model)."""
        self._residency.settle_inflight()
        self._residency.release_all(persistent_too=True)


class ParameterOffload:
    """`engine.optimizer.parameter_offload` (DeepSpeed's DeepSpeedZeRoOffload): the module whose
    parameters are sharded, the hook handles, the coordinator."""

    def __init__(self, events: UnitEvents, module: nn.Module, residency):
        self.module = module
        self.forward_hooks: list[UnitHookHandle] = []
        self.backward_hooks: list[UnitHookHandle] = []
        self.param_coordinator = ParamCoordinator(residency)
        persistent = residency.persistent_unit
        self.persistent_parameters = sorted(
            (p for f in persistent.flats for p in f.params), key=lambda p: p.ds_id) \
            if persistent is not None else []
        """DeepSpeed's list of the parameters kept gathered between steps (`ds_persist`)."""
        self._events = events
        self._residency = residency
        self._handles: dict[int, list[UnitHookHandle]] = {}
        for sub in module.modules():
            sub.ds_external_parameters = _NO_EXTERNAL
        self._hook_units(events.units)

    def attach_to(self, optimizer) -> None:
        """Set `optimizer.parameter_offload` to this object at stage 3, where DeepSpeed's
        optimizer has one (TRL looks for it there); stages 0-2 and no optimizer: nothing."""
        if optimizer is not None and self._residency.sharding_params:
            optimizer.parameter_offload = self

    def get_param_coordinator(self) -> ParamCoordinator:
        return self.param_coordinator

    def hooked_units(self) -> list[int]:
        """Indices of the units whose module hooks are all in place."""
        return [i for i, hs in self._handles.items() if not any(h.removed for h in hs)]

    def _hook_units(self, units) -> None:
        hooked = set(self.hooked_units())
        for unit in units:
            if unit.index in hooked:
                continue
            for handle in self._handles.pop(unit.index, []):  # a partly removed set
                if not handle.removed:
                    handle.remove()
            fwd, bwd = install_unit_hooks(self._events, unit)
            fwd = [UnitHookHandle(unit.index, h) for h in fwd]
            bwd = [UnitHookHandle(unit.index, h) for h in bwd]
            self._handles[unit.index] = fwd + bwd
            self.forward_hooks.extend(fwd)
            self.backward_hooks.extend(bwd)

    def _register_deepspeed_module(self, module: nn.Module, count=None) -> None:
        """(Re-)install the hooks of every unit inside `module` (the model itself: all of them).
        Registering the model invalidates the trace, as DeepSpeed's does. `count` is
        DeepSpeed's module-id counter; zerolite numbers units, not modules."""
        if not isinstance(module, nn.Module):
            raise ZeroliteConfigError(f"_register_deepspeed_module: expected the engine's "
                                      f"module or one of its submodules, got "
                                      f"{type(module).__name__}")
        inside = {id(m) for m in module.modules()}
        units = [u for u in self._events.units if id(u.module) in inside]
        if not units:
            where = "inside a unit" if any(m is module for m in self.module.modules()) \
                else "not part of the model this engine shards"
            raise ZeroliteConfigError(
                f"_register_deepspeed_module({type(module).__name__}): the module is {where}; "
                "zerolite hooks whole units, so register the model (engine.module) or a unit's "
                "module")
        if module is self.module:
            coordinator = self.param_coordinator
            if not coordinator.is_invalid_trace():
                coordinator._invalidate_trace()
        self._hook_units(units)

    @contextmanager
    def unhooked(self):
        """Every unit's module hooks removed inside, re-registered after (DeepSpeed's
        `unwrap_model_for_generation` does the same around `generate`): with the units gathered
        by the caller, a forward inside runs no gather, release or prefetch."""
        self._remove_module_hooks()
        try:
            yield self.module
        finally:
            self._register_deepspeed_module(self.module)

    def _remove_module_hooks(self) -> None:
        """Remove every unit's module hooks (DeepSpeed's destroy path)."""
        for handles in self._handles.values():
            for handle in handles:
                if not handle.removed:
                    handle.remove()
        self.forward_hooks, self.backward_hooks = [], []
