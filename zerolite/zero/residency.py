"""Residency: when each unit's full parameters are gathered and when they are released.

Policy, in order of precedence:
  * stages 0-2: every unit stays gathered all the time;
  * stage 3, the persistent unit: see [Note: persistent parameters] below;
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

# [Note: persistent parameters] DeepSpeed marks every parameter with at most
# stage3_param_persistence_threshold elements persistent (in model order, within
# stage3_model_persistence_threshold in all). It is gathered at its first use like any other,
# never released after a module runs, released with everything else before the optimizer step
# and gathered again right after it: between steps it is AVAILABLE with its full value, and
# after the first forward no module waits for it. Here those parameters make up one unit, the
# persistent unit, with that life: gathered with the first unit used (or by a module holding
# one of its parameters), kept by every per-unit release and by the release at the end of a
# backward or an inference forward, gathered again after each step (one gather for all of
# them, as DeepSpeed's). Released only by what releases DeepSpeed's: empty_partition_cache(),
# the coordinator's release_and_reset_all, a checkpoint save or load (gathered again after
# it), a GatheredParameters listing one of its parameters, and the end of the backward (or
# inference forward) in which the trace is recorded: DeepSpeed releases it after each module
# then, here it waits for the end of that backward, since root-level code saves plain views
# of it (saved_views.py). Its shards are placed like any other flat's (DeepSpeed keeps a persistent
# partition on the device under offload_param; here only the gathered copy stays there).


class Residency:
    def __init__(self, units: list[Unit], gatherer, *, stage: int, prefetch_numel: int,
                 max_live_numel: int, max_reuse_distance: int, stats: StatsRecorder):
        self.units = units
        self.gatherer = gatherer
        self.stats = stats
        self.sharding_params = stage == 3
        self.numels = [u.numel for u in units]
        self.always_gathered = set() if self.sharding_params else {u.index for u in units}
        """Stages 0-2: every unit, gathered here and never released."""
        self.persistent_unit = next((u for u in units if u.persistent), None)
        self.max_live_numel = max_live_numel
        self.max_reuse_distance = max_reuse_distance
        self.scheduler = PrefetchScheduler(self.numels, enabled=prefetch_numel > 0,
                                           prefetch_numel=prefetch_numel,
                                           max_live_numel=max_live_numel)
        self.peak_live_numel = 0
        for index in sorted(self.always_gathered):
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
    def _issue(self, unit: Unit, fetch: bool = False) -> None:
        with record_function(f"zerolite::gather {unit.name}"):
            unit.gather(self.gatherer, async_op=True, fetch=fetch)
        self.stats.track_gather(unit.name, unit.pending_works)

    def ensure_gathered(self, unit: Unit, phase, fetch: bool = True) -> None:
        """Gather `unit` (waiting for its prefetch if one is in flight), then prefetch. The
        persistent unit is gathered too if it is not (its first use, or after a release).
        `fetch`: a gather for running modules (forward, backward, recompute, direct call),
        which may be in a flat's fetch_dtype; False for GatheredParameters (exact)."""
        self.stats.poll()
        persistent = self.persistent_unit
        if persistent is not None and persistent.state is UnitState.SHARDED:
            self._issue(persistent)
        if unit.state is UnitState.SHARDED:
            self._issue(unit, fetch=fetch)
        if phase is not None:
            picks = self.scheduler.on_use(
                phase, unit.index, lambda i: self.units[i].state is not UnitState.SHARDED,
                self.live_numel(), self._in_flight_numel() - (
                    self.numels[unit.index] if unit.state is UnitState.GATHERING else 0))
            for i in picks:
                self._issue(self.units[i], fetch=True)
                self.stats.current.prefetched += 1
        if persistent is not None and persistent.state is UnitState.GATHERING:
            self._wait(persistent)
        if unit.state is UnitState.GATHERING:
            self._wait(unit)
        self._note_live()

    def ensure_persistent(self) -> None:
        """Gather the persistent unit if it is not (a module holding one of its parameters
        runs outside every unit's forward)."""
        if self.persistent_unit is not None and \
                self.persistent_unit.state is not UnitState.GATHERED:
            self.ensure_gathered(self.persistent_unit, None)

    def _wait(self, unit: Unit) -> None:
        if unit.state is UnitState.GATHERING:
            start = self.stats.now()
            with self.stats.timed_wait("all_gather_wait_s"), \
                    record_function(f"zerolite::wait_gather {unit.name}"):
                unit.wait_gathered()
            self.stats.poll()
            self.stats.event("wait", f"wait {unit.name}", start, self.stats.now())

    def prefetch_phase_start(self, phase) -> None:
        """Issue the gathers the next phase starts with (backward, right after forward)."""
        picks = self.scheduler.first_units(
            phase, lambda i: self.units[i].state is not UnitState.SHARDED, self.live_numel(),
            self._in_flight_numel())
        for i in picks:
            self._issue(self.units[i], fetch=True)
            self.stats.current.prefetched += 1

    # -- releasing ---------------------------------------------------------------------
    def release(self, unit: Unit, persistent_too: bool = False) -> None:
        """Release `unit` unless it stays gathered: at stages 0-2 always, the persistent unit
        unless `persistent_too` ([Note: persistent parameters])."""
        if unit.index in self.always_gathered or (unit.persistent and not persistent_too):
            return
        unit.release()

    def after_forward(self, unit: Unit) -> None:
        if unit.is_root:
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

    def release_all(self, persistent_too: bool = False) -> None:
        """Release every unit that may be released (at the end of a backward or an inference
        forward: nothing autograd saved still needs a buffer). The persistent unit too with
        `persistent_too`, or while the trace is recorded."""
        persistent_too = persistent_too or not self.scheduler.trace_complete()
        for unit in self.units:
            self.release(unit, persistent_too)

    def refresh_persistent(self) -> None:
        """After the optimizer step: gather again what stays gathered, from the new shards
        (the persistent unit is gathered whether or not it was before, as DeepSpeed's)."""
        again = [self.units[i] for i in sorted(self.always_gathered)]
        if self.persistent_unit is not None:
            again.append(self.persistent_unit)
        for unit in again:
            unit.release()
            self._issue(unit)
        for unit in again:
            unit.wait_gathered()
