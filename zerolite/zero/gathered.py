"""`GatheredParameters`: full values of sharded parameters for a block of user code
(DeepSpeed's `deepspeed.zero.GatheredParameters`), and the external-parameter no-ops.

Two kinds of sharded parameters:
  * engine-managed (`p.zl_handle`): their unit is gathered (all its flats at once) and the
    parameters become views into the unit's full buffer; on exit a unit that this context
    gathered is released again (stage 3; units that are always gathered stay), and so is the
    persistent unit whenever one of its parameters was listed: DeepSpeed partitions every
    listed parameter, persistent ones included (they are gathered again at their next use).
  * zero.Init-partitioned, not yet in an engine (`p.zl_partitioned`): the slices are
    all-gathered into a full tensor; on exit the parameter goes back to its slice.

With `modifier_rank`, on exit each parameter's (possibly modified) full value is broadcast
from that rank and written back into what persists: this rank's slice of the fp32 master
(or of the shard, for parameters that are not optimized), then the compute-dtype shard is
refreshed; for zero.Init parameters, the local slice. Without it, modifications are not
kept (as in DeepSpeed) — for a unit that stays gathered they would linger in the full buffer
until the next optimizer step rewrites it, so always pass `modifier_rank` when you write.

Every rank must enter and leave the context with the same parameters (it is collective).
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from zerolite.errors import ZeroliteConfigError
from zerolite.zero.flat_placement import MasterHome, ShardHome
from zerolite.zero.sliced_param import broadcast_, gather_partitioned, release_partitioned
from zerolite.zero.shard_math import overlap, rank_range
from zerolite.zero.unit import UnitState

logger = logging.getLogger("zerolite")


def _as_list(params) -> list:
    if params is None:
        return []
    if isinstance(params, torch.Tensor):
        return [params]
    out, seen = [], set()
    for p in params:
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


class GatheredParameters:
    """Gather `params` (one parameter or an iterable; None entries are ignored) for the
    duration of the context. See the module docstring.

    `fwd_module`: accepted; DeepSpeed registers the params as external parameters of it,
    which zerolite does not need (see `register_external_parameter`). `enabled=False`: no-op.
    """

    def __init__(self, params, modifier_rank: int | None = None, fwd_module=None,
                 enabled: bool = True):
        self.enabled = enabled
        self.params = _as_list(params) if enabled else []
        self.modifier_rank = modifier_rank
        if enabled and modifier_rank is not None and dist.is_initialized() and \
                not 0 <= modifier_rank < dist.get_world_size():
            raise ZeroliteConfigError(
                f"GatheredParameters(modifier_rank={modifier_rank}): expected a rank in "
                f"[0, {dist.get_world_size()}) or None")
        self._units: list = []
        """(sharded, unit, was_gathered) for every unit of a managed param, in first-use order."""
        self._partitioned: list = []

    # -- enter ---------------------------------------------------------------------------
    def __enter__(self):
        if not self.enabled:
            return self
        seen = set()
        for p in self.params:
            handle = getattr(p, "zl_handle", None)
            if handle is not None:
                key = (id(handle.sharded), handle.unit.index)
                if key not in seen:
                    seen.add(key)
                    self._units.append((handle.sharded, handle.unit,
                                        handle.unit.state is not UnitState.SHARDED))
            elif getattr(p, "zl_partitioned", None) is not None:
                self._partitioned.append(p)
        for sharded, unit, _ in self._units:
            sharded.residency.ensure_gathered(unit, None, fetch=False)
        for p in self._partitioned:
            gather_partitioned(p)
        return self

    # -- exit ----------------------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb):
        if not self.enabled:
            return False
        try:
            if self.modifier_rank is not None and exc_type is None:
                self._write_back_managed()
        finally:
            # zero.Init params: broadcast (if modifying) and back to the local slice.
            for p in self._partitioned:
                release_partitioned(p, self.modifier_rank if exc_type is None else None)
            for sharded, unit, was_gathered in self._units:
                if not was_gathered or unit.persistent:  # DeepSpeed partitions those too
                    sharded.release_gathered(unit)
        return False

    @torch.no_grad()
    def _write_back_managed(self) -> None:
        touched, edited = {}, {}
        for p in self.params:
            handle = getattr(p, "zl_handle", None)
            if handle is None:
                continue
            flat, slot = handle.flat, handle.flat.slots[handle.index]
            full_view = slot.flat_view(flat.full)
            value = p.detach()
            if tuple(value.shape) != tuple(slot.shape):
                raise ZeroliteConfigError(
                    f"GatheredParameters: {slot.name!r} has shape {tuple(slot.shape)} but was "
                    f"given a value of shape {tuple(value.shape)}; modify it in place instead")
            if value.data_ptr() != full_view.data_ptr() or not value.is_contiguous():
                full_view.copy_(value.reshape(-1))  # p.data was replaced: take its value
            broadcast_(full_view, src=self.modifier_rank)
            # This rank's part of [offset, offset + numel) in flat coordinates.
            mine = rank_range(flat.rank, flat.shard_numel)
            part = overlap((slot.offset, slot.offset + slot.numel), mine)
            home = flat.placement.master_home
            if home in (MasterHome.DEVICE, MasterHome.SHARD, MasterHome.HOST):
                target = flat.master.data
            elif home is MasterHome.NONE and flat.placement.shard.home is not ShardHome.FILE:
                target = flat.shard
            else:  # the value lives in offload files: edit a copy, written back below
                target = edited.get(id(flat))
                if target is None:
                    target = edited[id(flat)] = (flat.master_value() if flat.master is not None
                                                 else flat.shard_value().clone())
            if part is not None:
                a, b = part
                target[a - mine[0]:b - mine[0]].copy_(full_view[a - slot.offset:b - slot.offset])
            touched[id(flat)] = flat
        for key, value in edited.items():
            flat = touched[key]
            flat.write_master(value) if flat.master is not None else flat.write_shard(0, value)
        for flat in touched.values():
            flat.refresh_shard_from_master()
            # Units that stay gathered already hold the broadcast value in their full buffer;
            # make sure each param views it again (in case the user replaced p.data).
            if flat.is_full_allocated:
                flat.use_full_views()


def register_external_parameter(module, parameter) -> None:
    """Accepted for DeepSpeed compatibility; nothing to do in zerolite.

    DeepSpeed gathers parameter by parameter, on the module that owns each one, so a module
    whose forward uses another module's parameter must declare it ("external") to get it
    gathered in time. zerolite gathers per unit: all parameters of a unit are gathered
    together before the unit's forward; a parameter reachable from more than one unit (a
    tied weight) belongs to their lowest common ancestor unit, which stays gathered while its
    whole subtree runs; and the root unit stays gathered from the start of forward until its
    backward. So the usual cases DeepSpeed needs this call for (tied embeddings/heads, a
    parameter of the root used inside a block) are already covered. A block that reads a
    parameter of a *sibling* block that it does not hold as a submodule is not: put both in
    one unit (a unit policy), make the parameter reachable from both, or read it inside
    `GatheredParameters`.
    """
    logger.debug("register_external_parameter(%s, %s): not needed in zerolite (params are "
                 "gathered per unit)", type(module).__name__,
                 tuple(getattr(parameter, "shape", ())))


def unregister_external_parameter(module, parameter) -> None:
    """Accepted for DeepSpeed compatibility; see `register_external_parameter`."""
    logger.debug("unregister_external_parameter(%s): nothing to undo", type(module).__name__)
