"""One unit: a module subtree whose parameters are gathered and released together.

At stage 3 the last unit may be the persistent unit (`persistent=True`): every parameter at or
below stage3_param_persistence_threshold, wherever it sits in the model, in one unit that is
gathered at its first use and kept gathered between steps (residency.py,
[Note: persistent parameters]). Its `module` is the model itself; it has no forward of its own.

State machine: SHARDED -> GATHERING -> GATHERED -> SHARDED. `Unit.state` is the only record of
whether a unit's params are gathered (its flats only hold or do not hold a full buffer); every
transition goes through `_move`, and any other transition is a bug in zerolite and raises
ZeroliteStateError naming the unit.
"""
from __future__ import annotations

import enum

import torch
import torch.nn as nn

from zerolite.comm.last_collective import RECORD as LAST
from zerolite.errors import ZeroliteStateError
from zerolite.zero.flat_param import FlatParam
from zerolite.zero.flat_placement import ON_DEVICE, PlacementPlan
from zerolite.zero.param_status import ZeroParamStatus, mark


class UnitState(enum.Enum):
    SHARDED = "sharded"
    GATHERING = "gathering"
    GATHERED = "gathered"


_TRANSITIONS = {(UnitState.SHARDED, UnitState.GATHERING),
                (UnitState.GATHERING, UnitState.GATHERED),
                (UnitState.GATHERED, UnitState.SHARDED)}

_DS_STATUS = {UnitState.SHARDED: ZeroParamStatus.NOT_AVAILABLE,
              UnitState.GATHERING: ZeroParamStatus.INFLIGHT,
              UnitState.GATHERED: ZeroParamStatus.AVAILABLE}


class Unit:
    def __init__(self, index: int, name: str, module: nn.Module, flats: list[FlatParam],
                 plan: PlacementPlan = ON_DEVICE, persistent: bool = False):
        self.index = index
        self.persistent = persistent
        self.name = "<persistent>" if persistent else (name or "<root>")
        self.module = module
        self.flats = flats
        self.trainable_flats = [f for f in flats if f.requires_grad]
        self.numel = sum(f.padded_numel for f in flats)
        """Elements of the full (padded) parameters: what gathering this unit costs."""
        self.full_nbytes = sum(f.padded_numel * f.full.element_size() for f in flats)
        self.active_modules: set[int] = set()
        """DeepSpeed's `param.ds_active_sub_modules` (the same set object on every param of
        the unit): this unit's index while its forward or backward is running."""
        for flat in flats:
            for p in flat.params:
                p.ds_active_sub_modules = self.active_modules
        self.plan = plan
        """The placement plan of the flats: told before and after each gather and release
        (offload_param nvme brings the shards into RAM around the gather)."""
        self._state = UnitState.SHARDED
        mark([p for f in flats for p in f.params], _DS_STATUS[UnitState.SHARDED])
        self._gather_works: list = []
        self.pending_input_grads = 0
        """Forward calls whose backward has not reached the unit's inputs yet."""
        self.reduced_flats = 0
        """Trainable flats whose reduce-scatter was launched in the current backward."""
        self.direct_calls: list[bool] = []
        """One entry per owner-submodule call in progress outside the unit's forward (hooks.py):
        whether that call gathered the unit (so its end may release it)."""
        self.forward_start = 0.0
        self.backward_start = 0.0
        """When this unit's last forward / backward began (StatsRecorder clock), for traces."""

    @property
    def is_root(self) -> bool:
        return self.index == 0

    @property
    def state(self) -> UnitState:
        return self._state

    def _move(self, value: UnitState) -> None:
        """The one way the state changes. Every transition also writes the params'
        `ds_status` (param_status.py)."""
        if (self._state, value) not in _TRANSITIONS:
            raise ZeroliteStateError(
                f"unit {self.name!r}: transition {self._state.value} -> {value.value} is not "
                "allowed; this is a zerolite bug, please report it")
        self._state = value
        status = _DS_STATUS[value]
        for flat in self.flats:
            mark(flat.params, status)

    def _expect(self, *states: UnitState) -> None:
        if self.state not in states:
            raise ZeroliteStateError(
                f"unit {self.name!r} is {self.state.value}, expected "
                f"{' or '.join(s.value for s in states)}; this is a zerolite bug, please report it")

    # -- parameters --------------------------------------------------------------------
    def gather(self, gatherer, async_op: bool = False, fetch: bool = False) -> None:
        """Start (or finish, if not async) the all-gather of every flat param of the unit.
        `fetch`: for a forward or backward (prefetches too), which may gather a flat in its
        fetch_dtype."""
        if self.state is not UnitState.SHARDED:
            if not async_op:
                self.wait_gathered()
            return
        LAST.next_unit = self.name
        self.plan.before_gather(self)
        with torch.no_grad():
            self._gather_works = [gatherer.start(flat, fetch=fetch) for flat in self.flats]
        self._move(UnitState.GATHERING)
        if not async_op:
            self.wait_gathered()

    @property
    def pending_works(self) -> list:
        return list(self._gather_works)

    def wait_gathered(self) -> None:
        if self.state is UnitState.GATHERED:
            return
        self._expect(UnitState.GATHERING)
        for work in self._gather_works:
            if work is not None:
                work.wait()
        self._gather_works = []
        self.plan.after_gather(self)
        for flat in self.flats:
            flat.use_full_views()
        self._move(UnitState.GATHERED)

    def release(self, keep_secondary: bool = False) -> None:
        """Give the full buffers back. `keep_secondary` (hpZ, after a forward whose backward
        will gather the unit again): each flat keeps its secondary shard first; otherwise
        the secondary shards are dropped (flat_param.py, [Note: hpZ secondary shard])."""
        if not keep_secondary:
            self.drop_secondary()
        if self.state is UnitState.SHARDED:
            return
        if self.state is UnitState.GATHERING:
            self.wait_gathered()
        for flat in self.flats:
            if keep_secondary:
                flat.keep_secondary()
            flat.free_full()
        self.plan.after_release(self)
        self._move(UnitState.SHARDED)

    def drop_secondary(self) -> None:
        for flat in self.flats:
            flat.drop_secondary()

    @property
    def secondary_nbytes(self) -> int:
        """Bytes of hpZ secondary shards this unit holds now."""
        return sum(f.secondary_nbytes for f in self.flats)

    # -- gradients ---------------------------------------------------------------------
    def start_reduce(self, flat: FlatParam, reducer):
        """Launch the reduction of `flat`'s full gradient; returns (pending, flat, buffer)
        or None. The caller gives the buffer back to the pool once the reduction is done."""
        buf = flat.take_grad_buffer()
        if flat.master is None:
            flat.pool.give(buf)
            return None  # grads of params that are not optimized are dropped
        LAST.next_unit = self.name
        return reducer.start(flat, buf), flat, buf

    def __repr__(self):
        return f"Unit({self.index}, {self.name!r}, {self.state.value}, flats={self.flats})"
