"""ShardedModel: turns a module into units of flat, sharded params and runs their lifecycle.

One engine, four stages:
  stage 3  releases a unit's full params after each use; grads reduce-scattered in backward
  stage 2  keeps full params; grads reduce-scattered in backward into fp32 shards
  stage 1  keeps full params and full fp32 grads (accumulated over micro-steps); reduce-
           scatters once per optimizer step; only the optimizer state is sharded
  stage 0  nothing sharded (one partition): grads all-reduced, full optimizer state per rank
"""
from __future__ import annotations

import enum
import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from zerolite.comm.collectives import gather_full_flat
from zerolite.comm.reducers import GradReducer, ParamGatherer
from zerolite.comm.topology import SecondaryGroup
from zerolite.config.zero_blocks import DEFAULT_LEAF_MODULE_CLASSES
from zerolite.errors import ZeroliteConfigError
from zerolite.zero.buffer_pool import BufferPool
from zerolite.zero.flat_param import FlatParam
from zerolite.zero.flat_placement import ON_DEVICE, FlatSpec, PlacementPlan
from zerolite.zero.hooks import grad_tensors, install_grad_hooks
from zerolite.zero.leaf_modules import apply_leaf_module_config, tag_leaf_parameters
from zerolite.zero.module_hooks import ParameterOffload
from zerolite.zero.param_status import ZeroParamType
from zerolite.zero.partition import (UnitPolicy, assign_params, find_unit_modules,
                                     persistent_params, split_persistent)
from zerolite.zero.grad_reduction import GradReduction
from zerolite.zero.residency import Residency
from zerolite.zero.shard_math import shard_numel
from zerolite.zero.saved_views import SavedViewHooks
from zerolite.zero.step_stats import StatsRecorder
from zerolite.zero.unit import Unit, UnitState

logger = logging.getLogger("zerolite")


@dataclass(frozen=True)
class ParamHandle:
    """Where a managed parameter lives; set on each parameter as `param.zl_handle`."""

    sharded: "ShardedModel"
    unit: Unit
    flat: FlatParam
    index: int
    """Position of the parameter in `flat.params` / `flat.slots`."""


@dataclass
class ShardingOptions:
    """The zero_optimization knobs the sharded model honours (DeepSpeed names; elements)."""

    stage: int = 3
    prefetch_numel: int = 50_000_000
    """stage3_prefetch_bucket_size: elements prefetched ahead of use; 0 turns prefetch off."""
    max_live_numel: int = 1_000_000_000
    """stage3_max_live_parameters: elements gathered at once (in use + prefetched + kept)."""
    max_reuse_distance: int = 1_000_000_000
    """stage3_max_reuse_distance: keep a unit after forward if it is needed again within
    this many elements of other units (the last blocks, whose backward comes first)."""
    persistence_threshold: int = 100_000
    """stage3_param_persistence_threshold: parameters this small (numel) go to the persistent
    unit, kept gathered between steps (residency.py, [Note: persistent parameters])."""
    model_persistence_threshold: int = sys.maxsize
    """stage3_model_persistence_threshold: bound on the persistent unit's elements."""
    reduce_bucket_numel: int = 500_000_000
    """reduce_bucket_size: elements of full gradient buffers allowed in flight."""
    reduce_once_per_step: bool = False
    """zerolite.reduce_once_per_step: with gradient accumulation, keep full fp32 gradients
    across micro-steps and reduce them once, in the boundary micro-step's backward (stages
    2-3; stage 1 always does). Costs 4 bytes x parameters per rank while accumulating."""
    trace: bool = False
    """Record a timeline of compute and communication events (StepStats.events)."""
    leaf_module: dict | None = None
    """zero_optimization.leaf_module: modules flagged as ZeRO-3 leaves before units are
    chosen (zero/leaf_modules.py)."""

    @classmethod
    def from_config(cls, zc, trace: bool = False, reduce_once_per_step: bool = False
                    ) -> "ShardingOptions":
        return cls(stage=zc.stage, prefetch_numel=zc.stage3_prefetch_bucket_size,
                   max_live_numel=zc.stage3_max_live_parameters,
                   max_reuse_distance=zc.stage3_max_reuse_distance,
                   persistence_threshold=zc.stage3_param_persistence_threshold,
                   model_persistence_threshold=zc.stage3_model_persistence_threshold,
                   reduce_bucket_numel=zc.reduce_bucket_size,
                   reduce_once_per_step=reduce_once_per_step, trace=trace,
                   leaf_module=zc.leaf_module)


class TrainingState(enum.Enum):
    """The phase the sharded model is in; `ShardedModel.state` is its only record.

    IDLE      between steps, or a forward that did not come through the engine
    FORWARD   an engine forward (the saved-view hooks are active)
    BACKWARD  from the first unit backward or param grad until finish_backward
    """

    IDLE = "idle"
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass
class GradSync:
    """When a backward's gradients are reduced (the policy; FSDP2's set_requires_gradient_sync).

    [Note: deferred reduction] Stage 1 always keeps full fp32 gradients over the micro-steps
    and reduce-scatters them once at the optimizer step; `no_sync()` (stages 0-1) does the
    same for the backwards inside it. Stage 0, and stages 2-3 with
    `zerolite.reduce_once_per_step`, defer every backward except the accumulation
    boundary's, which reduces everything as its gradients complete: DeepSpeed's engine
    all-reduces once, at the boundary, at stage 0 (with a 16-bit communication_data_type
    the sum is rounded once, not once per micro-step)."""

    reduce_at_step: bool = False
    """Stage 1: reduce at the optimizer step, never in backward."""
    once_per_step: bool = False
    """Stage 0, or zerolite.reduce_once_per_step."""
    requires_sync: bool = True
    """False inside engine.no_sync()."""
    at_boundary: bool = True
    """Is the current backward the accumulation boundary's? (set by the engine)"""
    grad_scale: float = 1.0
    """Factor on each parameter gradient as it is taken: 1/gas for a `loss.backward()` the
    engine did not scale (engine.py, [Note: loss.backward()]), else 1."""

    @property
    def deferring(self) -> bool:
        """Gradients of this backward stay in the full buffers (reduced later)."""
        return self.reduce_at_step or not self.requires_sync \
            or (self.once_per_step and not self.at_boundary)

    @property
    def reduce_at_optimizer_step(self) -> bool:
        """The optimizer step itself must reduce what is still in full buffers."""
        return self.reduce_at_step or not self.requires_sync


class ShardedModel:
    def __init__(self, module: nn.Module, *, compute_dtype: torch.dtype,
                 group_of: dict[nn.Parameter, int], rank: int, world_size: int,
                 options: ShardingOptions | None = None, unit_policy: UnitPolicy | None = None,
                 reducer: GradReducer | None = None, gatherer: ParamGatherer | None = None,
                 device_layer=None, plan: PlacementPlan = ON_DEVICE,
                 master_dtype: torch.dtype = torch.float32,
                 secondary: SecondaryGroup | None = None,
                 comm_dtypes: dict[nn.Parameter, torch.dtype] | None = None,
                 grad_accum_dtype: torch.dtype = torch.float32):
        """`secondary`: this rank's hpZ group (stage 3, zero_hpz_partition_size > 1), the
        same one the gatherer gathers secondary shards over; None = no hpZ. `comm_dtypes`:
        the dtype each parameter's gradient is reduced in, where it is not the reducer's
        own (torch_autocast, zerolite/autocast.py): a unit's parameters are split into one
        flat per such dtype. `grad_accum_dtype`: the precision gradients are kept at
        ([Note: gradient precision] in flat_param.py)."""
        options = options or ShardingOptions()
        self.module = module
        self.options = options
        self.stage = options.stage
        self.plan = plan
        """Where each flat's shard and master live (flat_placement.py), chosen per flat as
        the flats are built; also told around gathers and after each step."""
        self.grad_sync = GradSync(reduce_at_step=self.stage == 1,
                                  once_per_step=options.reduce_once_per_step or self.stage == 0)
        self.state = TrainingState.IDLE
        self.partitions = 1 if self.stage == 0 else world_size
        self.rank, self.world_size = rank, world_size
        self.secondary = secondary
        self.compute_dtype = compute_dtype
        self.master_dtype = master_dtype
        """dtype of the masters and their gradient shards (fp32, or bf16 masters)."""
        self.comm_dtypes = comm_dtypes or {}
        self.grad_accum_dtype = grad_accum_dtype
        self.shows_param_grads = self.stage <= 1 and grad_accum_dtype == compute_dtype
        """Stages 0-1 accumulating in the parameters' dtype (DeepSpeed's default): `p.grad`
        shows the gradient after a backward (show_param_grads)."""
        self.reducer = reducer or GradReducer(world_size)
        self.gatherer = gatherer or ParamGatherer()
        apply_leaf_module_config(module, options.leaf_module, DEFAULT_LEAF_MODULE_CLASSES)
        tag_leaf_parameters(module)
        unit_modules = find_unit_modules(module, unit_policy)
        owner, names = assign_params(module, unit_modules)
        persistent = persistent_params(module, options.persistence_threshold,
                                       options.model_persistence_threshold) \
            if self.stage == 3 else set()
        unit_modules, owner, persistent_index = split_persistent(unit_modules, owner,
                                                                 persistent)
        for p in names:
            if not p.is_floating_point():
                raise ZeroliteConfigError(f"parameter {names[p][0]!r} has dtype {p.dtype}; "
                                          "zerolite shards floating-point parameters only")
        self.pool = BufferPool()
        per_unit: list[list[nn.Parameter]] = [
            [] for _ in range(len(unit_modules) + 1 + (persistent_index is not None))]
        for p in names:  # model order
            per_unit[owner[p]].append(p)
        flats = self._build_flats(per_unit, names, group_of, persistent_index)
        self.units: list[Unit] = []
        for index, unit_flats in enumerate(flats):
            is_persistent = index == persistent_index
            name, mod = ("", module) if index == 0 or is_persistent \
                else unit_modules[index - 1]
            self.units.append(Unit(index, name, mod, unit_flats, plan, persistent=is_persistent))
        self._unit_of = {id(f): u for u in self.units for f in u.flats}
        self.saved_views = SavedViewHooks(self.pool, self._regather_for_backward)
        self.stats = StatsRecorder(trace=options.trace, layer=device_layer)
        self.residency = Residency(self.units, self.gatherer, stage=self.stage,
                                   prefetch_numel=options.prefetch_numel,
                                   max_live_numel=options.max_live_numel,
                                   max_reuse_distance=options.max_reuse_distance,
                                   stats=self.stats)
        self.reduction = GradReduction(self.reducer, max_inflight_numel=options.reduce_bucket_numel,
                                       stats=self.stats)
        self._tag_params()
        self.parameter_offload = ParameterOffload(self, module, self.residency)
        """The units' module hooks and the trace, under DeepSpeed's names (module_hooks.py)."""
        self._grad_hook_handles = install_grad_hooks(self)
        logger.debug("zerolite units: %s", self.units)

    def _tag_params(self) -> None:
        """DeepSpeed-style attributes (ds_id, ds_shape, ds_numel, ds_tensor: this rank's piece
        of the param, a live view of its shard) plus our own handle, so
        code that checks for ZeRO-3 params (and GatheredParameters) can find them."""
        where = {id(p): (unit, flat, i) for unit in self.units for flat in unit.flats
                 for i, p in enumerate(flat.params)}
        for ds_id, p in enumerate(self.module.parameters()):  # model order, as DeepSpeed's
            unit, flat, i = where[id(p)]
            slot = flat.slots[i]
            p.zl_handle = ParamHandle(self, unit, flat, i)
            p.ds_id, p.ds_shape, p.ds_numel = ds_id, torch.Size(slot.shape), slot.numel
            p.ds_param_type = ZeroParamType.PARTITIONED
            p.ds_persist = unit.persistent
            p.ds_tensor = flat.local_piece(i)

    def _build_flats(self, per_unit, names, group_of, persistent_index
                     ) -> list[list[FlatParam]]:
        """Every unit's flats: the params bucketed by (group, requires_grad, comm dtype), each
        flat placed by the plan, which sees all of them first (e.g. offload `ratio` counts
        elements). A 16-bit comm dtype is also the dtype a sharded unit's fetches gather
        that flat in (torch_autocast, autocast.py); the persistent unit gathers exactly."""
        buckets = []
        for params in per_unit:
            unit_buckets: dict[tuple, list] = {}
            for p in params:
                group = group_of.get(p) if p.requires_grad else None
                key = (group, p.requires_grad, self.comm_dtypes.get(p))
                unit_buckets.setdefault(key, []).append((names[p], p))
            buckets.append(list(unit_buckets.items()))
        specs = [FlatSpec(unit_index=ui, position=pos,
                          shard_numel=shard_numel(sum(p.numel() for _, p in items),
                                                  self.partitions),
                          optimized=group is not None and requires_grad,
                          compute_dtype=self.compute_dtype, device=items[0][1].device,
                          master_dtype=self.master_dtype)
                 for ui, unit_buckets in enumerate(buckets)
                 for pos, ((group, requires_grad, _), items) in enumerate(unit_buckets)]
        placements = iter(self.plan.place_all(specs))
        hpz = self.secondary

        def fetch_dtype(unit_index, comm):
            sixteen = comm is not None and comm.itemsize == 2
            return comm if (sixteen and self.partitions > 1 and self.stage == 3
                            and unit_index != persistent_index) else None

        return [[FlatParam(items, rank=self.rank, partitions=self.partitions,
                           compute_dtype=self.compute_dtype, group_index=group, pool=self.pool,
                           placement=next(placements), master_dtype=self.master_dtype,
                           secondary_partitions=hpz.size if hpz else 1,
                           secondary_rank=hpz.position if hpz else 0, comm_dtype=comm,
                           fetch_dtype=fetch_dtype(ui, comm),
                           grad_accum_dtype=self.grad_accum_dtype,
                           keeps_reduced_grad=(self.stage == 0 and self.shows_param_grads
                                               and self.compute_dtype != torch.float32))
                 for (group, _, comm), items in unit_buckets]
                for ui, unit_buckets in enumerate(buckets)]

    # -- queries -----------------------------------------------------------------------
    @property
    def flats(self) -> list[FlatParam]:
        return [f for u in self.units for f in u.flats]

    def master_groups(self, group_hparams: list[dict]) -> list[dict]:
        """One group per entry of `group_hparams`, with this rank's masters of that group
        (empty where the group has nothing to train)."""
        return [{**hparams, "params": [f.master for f in self.flats
                                       if f.group_index == gi and f.master is not None]}
                for gi, hparams in enumerate(group_hparams)]

    def gathered_nbytes(self) -> int:
        return self.residency.live_nbytes()

    def secondary_nbytes(self) -> int:
        """hpZ secondary shards held now (between a unit's forward and its backward)."""
        return self.residency.secondary_nbytes()

    # -- saved tensors ------------------------------------------------------------------
    @contextmanager
    def forward_context(self):
        """Run a forward with the saved-view hooks around each unit's forward (the engine's
        forward does), so autograd never pins a pooled buffer (saved_views.py)."""
        with self.saved_views.forward():
            entered = self.state is TrainingState.IDLE
            if entered:
                self.state = TrainingState.FORWARD
            try:
                yield
            finally:
                if entered and self.state is TrainingState.FORWARD:
                    self.state = TrainingState.IDLE

    def release_gathered(self, unit: Unit) -> None:
        """Release a unit at the end of a GatheredParameters (the persistent unit too). If
        root-level code of a forward may have saved views of it for backward (saved_views.py):
        here, or anywhere between a forward and the end of its backward for the persistent
        unit, which root-level code uses plainly, its buffer is not reused until backward
        ends."""
        graph_alive = self.state is not TrainingState.IDLE or \
            self.units[0].state is not UnitState.SHARDED  # the root: forward until backward
        if (torch.is_grad_enabled() and self.saved_views.unprotected()) or \
                (unit.persistent and graph_alive):
            self.pool.reuse_blocked = True
        self.residency.release(unit, persistent_too=True)

    def _regather_for_backward(self, flat: FlatParam) -> None:
        self.residency.ensure_gathered(self._unit_of[id(flat)], None)

    # -- forward / backward events (called from hooks) ---------------------------------
    def before_unit_forward(self, unit: Unit) -> None:
        if unit.is_root and self.state is TrainingState.IDLE and torch.is_grad_enabled():
            # The module was called directly, not through the engine: autograd may keep
            # views into pooled buffers until backward, so none is reused until then.
            self.pool.reuse_blocked = True
        unit.active_modules.add(unit.index)
        if self.in_backward:  # a recompute (activation checkpointing) inside backward
            self.residency.ensure_gathered(unit, None)
            return
        if not unit.is_root:
            self.saved_views.enter_unit()
        sched = self.residency.scheduler
        phase = sched.forward if torch.is_grad_enabled() else sched.inference
        self.residency.ensure_gathered(unit, phase)
        unit.forward_start = self.stats.now()

    def after_unit_forward(self, unit: Unit, needs_backward: bool) -> None:
        if self.in_backward:
            return  # a recompute inside backward: its backward is about to need the params
        if not unit.is_root:
            self.saved_views.leave_unit()
        unit.active_modules.discard(unit.index)
        self.stats.event("compute", f"forward {unit.name}", unit.forward_start, self.stats.now())
        if unit.is_root:
            if needs_backward:  # the loss is next: start gathering what backward needs first
                self.residency.prefetch_phase_start(self.residency.scheduler.backward)
            else:
                self.residency.release_all()  # before the trace is complete: persistent too
                self.residency.scheduler.end_inference()
            return
        if needs_backward:
            self.residency.after_forward(unit)
        else:
            self.residency.release(unit)

    def before_direct_call(self, unit: Unit) -> None:
        """A module holding some of `unit`'s parameters runs outside the unit's forward
        (`model.get_input_embeddings()(ids)`; a critic's `forward_value` calling its body and
        value head). DeepSpeed fetches per module, so this works there: gather the unit."""
        if unit.index in unit.active_modules or self.in_backward:
            if self.in_backward:  # a recompute inside backward
                self.residency.ensure_gathered(unit, None)
            unit.direct_calls.append(False)
            return
        if torch.is_grad_enabled():
            # autograd may keep views of this (or an inner unit's) buffer until backward
            self.pool.reuse_blocked = True
        gathers = unit.state is UnitState.SHARDED
        unit.direct_calls.append(gathers)
        self.residency.ensure_gathered(unit, None)

    def before_persistent_use(self) -> None:
        """A module holding persistent parameters runs: gather the persistent unit if it is
        not (used outside every unit's forward, or after empty_partition_cache). Nothing in a
        forward or backward releases it, so its buffer is never reused under autograd's views."""
        self.residency.ensure_persistent()

    def after_direct_call(self, unit: Unit, output) -> None:
        """Release what the call gathered, unless backward will need it (an `output` that
        requires grad: backward's end releases it then). A call nested in another finds the
        unit gathered: the outer call's end decides."""
        if not unit.direct_calls:  # the hooks were re-registered while the call ran
            return
        if not unit.direct_calls.pop() or unit.index in unit.active_modules:
            return
        if not (torch.is_grad_enabled() and grad_tensors(output)):
            self.residency.release(unit)

    @property
    def in_backward(self) -> bool:
        return self.state is TrainingState.BACKWARD

    def set_accumulation_boundary(self, at_boundary: bool) -> None:
        """Before each backward (the engine): is it the accumulation boundary's?"""
        self.grad_sync.at_boundary = at_boundary

    def set_grad_scale(self, scale: float) -> None:
        """Before each backward (the engine): the factor on this backward's gradients."""
        self.grad_sync.grad_scale = scale

    def set_requires_gradient_sync(self, requires: bool) -> None:
        """False: backwards keep their gradients in full buffers (engine.no_sync())."""
        self.grad_sync.requires_sync = requires

    def before_unit_backward(self, unit: Unit) -> None:
        self.state = TrainingState.BACKWARD
        unit.active_modules.add(unit.index)
        self.reduction.poll()
        self.residency.ensure_gathered(unit, self.residency.scheduler.backward)
        unit.backward_start = self.stats.now()

    def after_unit_backward(self, unit: Unit) -> None:
        self.stats.event("compute", f"backward {unit.name}", unit.backward_start,
                         self.stats.now())
        unit.pending_input_grads -= 1
        self._maybe_release_after_backward(unit)

    def before_param_grad(self, unit: Unit) -> None:
        """Autograd accumulates a grad into a param of the shape it has now: a unit whose
        param was used outside the unit's forward (no pre-backward hook gathered it) is
        gathered here; its release follows the grads' reduction as usual."""
        if unit.state is UnitState.SHARDED:
            self.residency.ensure_gathered(unit, None)

    def on_param_grad(self, unit: Unit, flat: FlatParam, index: int) -> None:
        self.state = TrainingState.BACKWARD
        if flat.take_param_grad(index, self.grad_sync.grad_scale):
            if self.grad_sync.deferring:
                unit.reduced_flats += 1  # done for this micro-step; reduced at the boundary
            else:
                self.reduction.launch(unit, flat)
            self._maybe_release_after_backward(unit)

    def _maybe_release_after_backward(self, unit: Unit) -> None:
        if (not unit.is_root and unit.pending_input_grads <= 0
                and unit.reduced_flats == len(unit.trainable_flats)):
            unit.active_modules.discard(unit.index)
            self.residency.release(unit)

    def finish_backward(self) -> None:
        """Reduce what is left, wait for every reduction, release, roll the order record."""
        if not self.grad_sync.deferring:
            self.reduction.drain(self.units)
        self.settle_host_copies()  # accumulation adds happen on the host here
        for unit in self.units:
            unit.pending_input_grads = 0
            unit.reduced_flats = 0
            unit.active_modules.clear()
        self.residency.release_all()
        for flat in self.flats:
            flat.grads_ready = 0
        self.residency.scheduler.end_step()
        self.state = TrainingState.IDLE
        self.pool.reuse_blocked = False
        self.show_param_grads()

    # [Note: p.grad at stages 0-1] DeepSpeed's stage 0 leaves each gradient on its parameter:
    # after a backward `p.grad` is this rank's sum so far (between micro-steps) or the
    # all-reduced average (after the boundary's), until the step; its stage 1 the local sum
    # between micro-steps (None after the boundary's backward). A program may read it or clip
    # it in place, and the step uses what it finds. Here the gradients live in the flats'
    # buffers, which have the parameters' dtype when gradients accumulate in it (DeepSpeed's
    # default, [Note: gradient precision] in flat_param.py), so `p.grad` is pointed at the
    # parameter's slot of the buffer the step will use (the accumulation buffer, then stage
    # 0's reduced gradient: the fp32 master's in fp32, the held 16-bit buffer in bf16/fp16,
    # which the step turns into the master's fp32 gradient): an in-place change is the change
    # the step sees. Every backward starts with `p.grad` None (hide_param_grads), so autograd
    # hands the hooks the new gradient alone and never adds into the buffer behind their back;
    # the step (and zero_grad) ends with None, as DeepSpeed's zero_grad. Reading gradients
    # through the tensor-fragment API hands stage 0's held gradient to the master early, and
    # `p.grad` is None from then on. Another data_types.grad_accum_dtype (the buffer is then
    # fp32) and stages 2-3 keep `p.grad` None, as DeepSpeed's stages 2-3 do.
    def show_param_grads(self) -> None:
        """After a backward at stages 0-1: each trainable parameter's `.grad` views its
        gradient ([Note: p.grad at stages 0-1])."""
        if not self.shows_param_grads or (self.stage == 1 and self.grad_sync.at_boundary):
            return
        for flat in self.flats:
            if flat.master is None:
                continue
            source = next((t for t in (flat.grad_buffer, flat.reduced_grad, flat.master.grad)
                           if t is not None), None)
            if source is None or source.device != flat.device \
                    or source.dtype != flat.compute_dtype:
                continue
            for slot, p in zip(flat.slots, flat.params):
                p.grad = slot.view(source)

    def hide_param_grads(self) -> None:
        """Before a backward and after the step: `p.grad` back to None (stages 0-1)."""
        if self.shows_param_grads:
            for flat in self.flats:
                for p in flat.params:
                    p.grad = None

    def reduce_deferred_grads(self) -> None:
        """At the step: stage 1's once-per-step reduce-scatter of the accumulated full
        gradients; stage 0's held 16-bit gradients to the masters."""
        if self.grad_sync.reduce_at_optimizer_step:
            self.reduction.drain(self.units)
        self._hand_reduced_grads()

    def _hand_reduced_grads(self) -> None:
        self.hide_param_grads()  # they may view the held buffers, which go back to the pool
        for flat in self.flats:
            flat.hand_reduced_grad()

    def drop_grads(self) -> None:
        """Forget this window's gradients (zero_grad outside a window): p.grad, the held
        16-bit ones and the masters'."""
        self.hide_param_grads()
        for flat in self.flats:
            flat.drop_reduced_grad()
            if flat.master is not None:
                flat.master.grad = None

    @torch.no_grad()
    def zero_missing_grads(self) -> None:
        """Before the optimizer step: give every optimized master that got no gradient in the
        whole step (its parameters unused, or frozen after initialize) a zero one, as
        DeepSpeed's ZeRO optimizers (stages 1-3) and its fp16/bf16 wrappers (stage 0) treat a
        missing gradient as zeros, so weight decay and the moments still move it. The engine
        skips it at stage 0 in fp32, where DeepSpeed's plain torch optimizer does not update
        a parameter without a gradient."""
        for unit in self.units:
            for flat in unit.trainable_flats:
                if flat.master is not None and flat.master.grad is None:
                    flat.take_grad_shard(torch.zeros(flat.shard_numel, dtype=torch.float32,
                                                     device=flat.device), unit.name)

    def reduce_pending_grads(self) -> None:
        """Reduce now every gradient still waiting in a full buffer (stage 1, or
        reduce_once_per_step between boundaries) and wait for host copies: the tensor-fragment
        API reads the reduced shards. Later micro-steps are added to them, as at the step."""
        self.reduction.drain(self.units)
        self._hand_reduced_grads()
        self.settle_host_copies()

    def empty_cache(self) -> None:
        """Release every gathered unit at stage 3, the persistent one too (it is gathered
        again at its next use), and drop the pool's free buffers: the memory DeepSpeed's
        empty_partition_cache() returns."""
        self.residency.settle_inflight()
        self.residency.release_all(persistent_too=True)
        self.pool.clear()

    @contextmanager
    def checkpoint_event(self):
        """Stage 3, around a checkpoint save or load and a consolidated 16-bit state dict:
        every unit is released first and the persistent unit gathered again after, the state
        DeepSpeed's checkpoint_event_prologue / _epilogue leave the parameters in."""
        if not self.residency.sharding_params:
            yield
            return
        self.residency.settle_inflight()
        self.residency.release_all(persistent_too=True)
        yield
        self.residency.ensure_persistent()

    def settle_host_copies(self) -> None:
        """offload 'cpu': block until every host <-> device copy issued so far is done."""
        self.plan.settle()

    # -- after the optimizer step --------------------------------------------------------
    @torch.no_grad()
    def refresh_params_from_masters(self) -> None:
        for flat in self.flats:
            flat.refresh_shard_from_master()
        self.plan.after_refresh()
        self.residency.refresh_persistent()


def gather_full_state_dict(sharded: ShardedModel, use_master: bool = True) -> dict[str, torch.Tensor]:
    """Every parameter, full and unsharded, under each of its names (tied params included).

    fp32 master values where they exist (`use_master`), otherwise the compute-dtype shard.
    Collective: every rank must call it; every rank gets the result.
    """
    out: dict[str, torch.Tensor] = {}
    for flat in sharded.flats:
        src = flat.master_value() if (use_master and flat.master is not None) \
            else flat.shard_value()
        full = gather_full_flat(src.to(flat.device), flat.partitions)  # host masters
        for slot in flat.slots:
            value = slot.view(full).clone()
            for name in slot.names:
                out[name] = value
    return out
