"""ShardedModel: turns a module into units of flat, sharded params and runs their lifecycle.

One engine, four stages (DESIGN.md):
  stage 3  releases a unit's full params after each use; grads reduce-scattered in backward
  stage 2  keeps full params; grads reduce-scattered in backward into fp32 shards
  stage 1  keeps full params and full fp32 grads (accumulated over micro-steps); reduce-
           scatters once per optimizer step; only the optimizer state is sharded
  stage 0  nothing sharded (one partition): grads all-reduced, full optimizer state per rank
"""
from __future__ import annotations

import logging
from collections import deque

import torch
import torch.nn as nn

from zerolite.comm.reducers import GradReducer, ParamGatherer
from zerolite.errors import ZeroliteConfigError
from zerolite.zero.flat_param import FlatParam
from zerolite.zero.hooks import install_hooks
from zerolite.zero.partition import UnitPolicy, assign_params, find_unit_modules
from zerolite.zero.unit import Unit, UnitState

logger = logging.getLogger("zerolite")

MAX_INFLIGHT_REDUCES = 2
"""Reduce-scatters allowed in flight before the oldest is waited for: bounds the number of
full-size fp32 gradient buffers alive during backward."""


class ShardedModel:
    def __init__(self, module: nn.Module, *, stage: int, compute_dtype: torch.dtype,
                 group_of: dict[nn.Parameter, int], rank: int, world_size: int,
                 unit_policy: UnitPolicy | None = None, reducer: GradReducer | None = None,
                 gatherer: ParamGatherer | None = None):
        self.module = module
        self.stage = stage
        self.reshard_after_use = stage == 3
        self.defer_reduce = stage == 1
        self.partitions = 1 if stage == 0 else world_size
        self.rank, self.world_size = rank, world_size
        self.reducer = reducer or GradReducer(world_size)
        self.gatherer = gatherer or ParamGatherer()
        self.compute_dtype = compute_dtype
        unit_modules = find_unit_modules(module, unit_policy)
        owner, names = assign_params(module, unit_modules)
        for p in names:
            if not p.is_floating_point():
                raise ZeroliteConfigError(f"parameter {names[p][0]!r} has dtype {p.dtype}; "
                                          "zerolite shards floating-point parameters only")
        self._cast_buffers(module, compute_dtype)
        per_unit: list[list[nn.Parameter]] = [[] for _ in range(len(unit_modules) + 1)]
        for p in names:  # model order
            per_unit[owner[p]].append(p)
        self.units: list[Unit] = []
        for index, params in enumerate(per_unit):
            name, mod = ("", module) if index == 0 else unit_modules[index - 1]
            self.units.append(Unit(index, name, mod, self._build_flats(params, names, group_of)))
        self.in_backward = False
        self._reduces: deque = deque()
        self._hook_handles = install_hooks(self)
        if not self.reshard_after_use:
            for unit in self.units:
                unit.gather(self.gatherer)
        logger.debug("zerolite units: %s", self.units)

    @staticmethod
    def _cast_buffers(module: nn.Module, dtype: torch.dtype) -> None:
        for sub in module.modules():
            for key, buf in sub._buffers.items():
                if buf is not None and buf.is_floating_point() and buf.dtype != dtype:
                    sub._buffers[key] = buf.to(dtype)

    def _build_flats(self, params, names, group_of) -> list[FlatParam]:
        buckets: dict[tuple, list] = {}
        for p in params:
            group = group_of.get(p) if p.requires_grad else None
            buckets.setdefault((group, p.requires_grad), []).append((names[p], p))
        return [FlatParam(items, rank=self.rank, partitions=self.partitions,
                          compute_dtype=self.compute_dtype, group_index=group)
                for (group, _), items in buckets.items()]

    # -- queries -----------------------------------------------------------------------
    @property
    def flats(self) -> list[FlatParam]:
        return [f for u in self.units for f in u.flats]

    def master_groups(self, group_hparams: list[dict]) -> list[dict]:
        groups = []
        for gi, hparams in enumerate(group_hparams):
            masters = [f.master for f in self.flats if f.group_index == gi and f.master is not None]
            if masters:
                groups.append({**hparams, "params": masters})
        return groups

    def gathered_nbytes(self) -> int:
        return sum(u.full_nbytes for u in self.units if u.state is not UnitState.SHARDED)

    # -- forward / backward events (called from hooks) ---------------------------------
    def before_unit_forward(self, unit: Unit) -> None:
        unit.gather(self.gatherer)

    def after_unit_forward(self, unit: Unit, needs_backward: bool) -> None:
        if not self.reshard_after_use or self.in_backward:
            return  # stages 0-2 keep params; a recompute inside backward still needs them
        if unit.is_root:
            if not needs_backward:
                unit.release()
            return
        unit.release()

    def before_unit_backward(self, unit: Unit) -> None:
        self.in_backward = True
        unit.gather(self.gatherer)

    def after_unit_backward(self, unit: Unit) -> None:
        unit.pending_input_grads -= 1
        self._maybe_release_after_backward(unit)

    def on_param_grad(self, unit: Unit, flat: FlatParam, index: int) -> None:
        self.in_backward = True
        if flat.take_param_grad(index) and not self.defer_reduce:
            self._launch_reduce(unit, flat)
            self._maybe_release_after_backward(unit)

    def _maybe_release_after_backward(self, unit: Unit) -> None:
        if (self.reshard_after_use and not unit.is_root and unit.pending_input_grads <= 0
                and unit.reduced_flats == len(unit.trainable_flats)):
            unit.release()

    # -- gradient reduction ------------------------------------------------------------
    def _launch_reduce(self, unit: Unit, flat: FlatParam) -> None:
        unit.reduced_flats += 1
        item = unit.start_reduce(flat, self.reducer)
        if item is None:
            return
        self._reduces.append(item)
        while len(self._reduces) > MAX_INFLIGHT_REDUCES:
            self._complete_reduce(self._reduces.popleft())

    @staticmethod
    def _complete_reduce(item) -> None:
        pending, flat = item
        shard = pending.wait()
        if flat.master.grad is None:
            flat.master.grad = shard
        else:
            flat.master.grad.add_(shard)

    def _drain_reduces(self) -> None:
        for unit in reversed(self.units):
            for flat in unit.trainable_flats:
                if flat.grad_buffer is not None:
                    self._launch_reduce(unit, flat)
        while self._reduces:
            self._complete_reduce(self._reduces.popleft())

    def finish_backward(self) -> None:
        """Reduce what is left (params that got no grad count as zero), wait, release."""
        if not self.defer_reduce:
            self._drain_reduces()
        for unit in self.units:
            unit.pending_input_grads = 0
            unit.reduced_flats = 0
            if self.reshard_after_use:
                unit.release()
        for flat in self.flats:
            flat.grads_ready = 0
        self.in_backward = False

    def reduce_deferred_grads(self) -> None:
        """Stage 1: the once-per-step reduce-scatter of the accumulated full gradients."""
        if self.defer_reduce:
            self._drain_reduces()

    # -- after the optimizer step --------------------------------------------------------
    @torch.no_grad()
    def refresh_params_from_masters(self) -> None:
        for flat in self.flats:
            flat.refresh_shard_from_master()
        if not self.reshard_after_use:
            for unit in self.units:
                unit.release()
                unit.gather(self.gatherer)

    def release_all(self) -> None:
        for unit in self.units:
            unit.release()


def gather_full_state_dict(sharded: ShardedModel, use_master: bool = True) -> dict[str, torch.Tensor]:
    """Every parameter, full and unsharded, under each of its names (tied params included).

    fp32 master values where they exist (`use_master`), otherwise the compute-dtype shard.
    Collective: every rank must call it; every rank gets the result.
    """
    from zerolite.comm import all_gather_flat

    out: dict[str, torch.Tensor] = {}
    for flat in sharded.flats:
        src = flat.master.detach() if (use_master and flat.master is not None) else flat.shard
        if flat.partitions == 1:
            full = src.clone()
        else:
            full = torch.empty(flat.padded_numel, dtype=src.dtype, device=src.device)
            all_gather_flat(full, src.contiguous())
        for slot in flat.slots:
            value = full[slot.offset:slot.offset + slot.numel].view(slot.shape).clone()
            for name in slot.names:
                out[name] = value
    return out
