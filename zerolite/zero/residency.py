"""Residency: when each unit's full parameters are gathered and when they are released.

Policy, in order of precedence:
  * stages 0-2 and persistent units (total numel <= stage3_param_persistence_threshold)
    stay gathered all the time;
  * a unit is gathered when needed, and the next units of the recorded order are
    prefetched (see schedule.py) within the prefetch and live budgets;
  * after forward, a unit that will be needed again within stage3_max_reuse_distance
    elements (e.g. the last blocks, whose backward comes first) is kept if the live budget
    allows; otherwise it is released;
  * after its backward (input grads done and its grads handed to the reducer) it is
    released; whatever is left is released when backward ends.
  * hpZ (zero_hpz_partition_size > 1): a unit released after a forward that backward
    follows keeps its secondary shards, so its next gather (backward's, or a recompute's
    under activation checkpointing) stays inside the node; every other release drops them
    (the unit's backward release, the end of backward, an inference forward).
"""
from __future__ import annotations

from torch.autograd.profiler import record_function

from zerolite.zero.schedule import PrefetchScheduler
from zerolite.zero.step_stats import StatsRecorder
from zerolite.zero.unit import Unit, UnitState


class Residency:
    def __init__(self, units: list[Unit], gatherer, *, stage: int, prefetch_numel: int,
                 max_live_numel: int, max_reuse_distance: int, persistence_threshold: int,
                 stats: StatsRecorder):
        self.units = units
        self.gatherer = gatherer
        self.stats = stats
        self.sharding_params = stage == 3
        self.numels = [u.numel for u in units]
        self.persistent = {u.index for u in units
                           if not self.sharding_params or self.numels[u.index] <= persistence_threshold}
        self.max_live_numel = max_live_numel
        self.max_reuse_distance = max_reuse_distance
        self.scheduler = PrefetchScheduler(self.numels, enabled=prefetch_numel > 0,
                                           prefetch_numel=prefetch_numel,
                                           max_live_numel=max_live_numel)
        self.peak_live_numel = 0
        for index in sorted(self.persistent):
            self._issue(units[index])
            units[index].wait_gathered()

    # -- accounting --------------------------------------------------------------------
    def live_numel(self) -> int:
        return sum(self.numels[u.index] for u in self.units if u.state is not UnitState.SHARDED)

    def live_nbytes(self) -> int:
        """Bytes of full parameter buffers gathered (or being gathered) right now."""
        return sum(u.full_nbytes for u in self.units if u.state is not UnitState.SHARDED)

    def secondary_nbytes(self) -> int:
        """Bytes of hpZ secondary shards held right now."""
        return sum(u.secondary_nbytes for u in self.units)

    def _in_flight_numel(self) -> int:
        return sum(self.numels[u.index] for u in self.units if u.state is UnitState.GATHERING)

    def _note_live(self) -> None:
        live = self.live_numel()
        if live > self.peak_live_numel:
            self.peak_live_numel = live
        self.stats.current.peak_live_bytes = max(self.stats.current.peak_live_bytes,
                                                 self.live_nbytes())

    # -- gathering ---------------------------------------------------------------------
    def _issue(self, unit: Unit) -> None:
        with record_function(f"zerolite::gather {unit.name}"):
            unit.gather(self.gatherer, async_op=True)
        self.stats.track_gather(unit.name, unit.pending_works)

    def ensure_gathered(self, unit: Unit, phase) -> None:
        """Gather `unit` (waiting for its prefetch if one is in flight), then prefetch."""
        self.stats.poll()
        if unit.state is UnitState.SHARDED:
            self._issue(unit)
        if phase is not None:
            picks = self.scheduler.on_use(
                phase, unit.index, lambda i: self.units[i].state is not UnitState.SHARDED,
                self.live_numel(), self._in_flight_numel() - (
                    self.numels[unit.index] if unit.state is UnitState.GATHERING else 0))
            for i in picks:
                self._issue(self.units[i])
                self.stats.current.prefetched += 1
        if unit.state is UnitState.GATHERING:
            start = self.stats.now()
            with self.stats.timed_wait("all_gather_wait_s"), \
                    record_function(f"zerolite::wait_gather {unit.name}"):
                unit.wait_gathered()
            self.stats.poll()
            self.stats.event("wait", f"wait {unit.name}", start, self.stats.now())
        self._note_live()

    def prefetch_phase_start(self, phase) -> None:
        """Issue the gathers the next phase starts with (backward, right after forward)."""
        picks = self.scheduler.first_units(
            phase, lambda i: self.units[i].state is not UnitState.SHARDED, self.live_numel(),
            self._in_flight_numel())
        for i in picks:
            self._issue(self.units[i])
            self.stats.current.prefetched += 1

    # -- releasing ---------------------------------------------------------------------
    def release(self, unit: Unit) -> None:
        if unit.index not in self.persistent:
            unit.release()

    def after_forward(self, unit: Unit) -> None:
        if unit.index in self.persistent or unit.is_root:
            return
        if self._reused_soon(unit) and self.live_numel() <= self.max_live_numel:
            return
        unit.release(keep_secondary=True)
        self.stats.current.peak_secondary_bytes = max(self.stats.current.peak_secondary_bytes,
                                                      self.secondary_nbytes())

    def _reused_soon(self, unit: Unit) -> bool:
        """Is `unit` needed again within max_reuse_distance elements of other units?"""
        if self.max_reuse_distance <= 0:
            return False
        fwd, bwd = self.scheduler.forward, self.scheduler.backward
        upcoming = fwd.record[fwd.position():] + bwd.record
        distance = 0
        for index in upcoming:
            if index == unit.index:
                return True
            distance += self.numels[index]
            if distance > self.max_reuse_distance:
                return False
        return False

    def settle_inflight(self) -> None:
        """Wait for every gather still in flight (prefetches) and release those units."""
        for unit in self.units:
            if unit.state is UnitState.GATHERING:
                unit.wait_gathered()
                self.release(unit)

    def release_all(self) -> None:
        for unit in self.units:
            self.release(unit)

    def refresh_persistent(self) -> None:
        """After the optimizer step: re-gather units that never release."""
        for index in sorted(self.persistent):
            unit = self.units[index]
            unit.release()
            self._issue(unit)
        for index in sorted(self.persistent):
            self.units[index].wait_gathered()
