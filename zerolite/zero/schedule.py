"""Prefetch scheduling from a recorded execution order.

Each step records the order in which units are needed, separately for forward and backward.
The next step prefetches from that record: when unit i is needed, the gathers of the units
that follow it are issued early, within two budgets (DeepSpeed's keys, counted in elements):

  stage3_prefetch_bucket_size  elements being prefetched ahead of use at any time (at least
                               the next unit whenever it is > 0)
  stage3_max_live_parameters   elements gathered in total (in use + prefetched)

When the order of this step departs from the record (data-dependent control flow, an eval
path, a resumed run) prefetching stops for the rest of that phase, units are gathered on
demand, and the new order is recorded for the next step. Nothing raises and nothing hangs:
every rank still issues the same collectives in the same order, as long as ranks take the
same branches (the same assumption every ZeRO-3 implementation makes).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger("zerolite")


@dataclass
class RecordedOrder:
    """Record-and-follow: the order items were used in last time (`record`) and this time
    (`current`). Used by the prefetch scheduler (per phase) and by offload_param's read-ahead
    (zerolite/offload/param_swap.py)."""

    record: list = field(default_factory=list)
    """Order seen in the previous step (what we prefetch from)."""
    current: list = field(default_factory=list)
    """Order being seen in this step."""
    diverged: bool = False

    def position(self) -> int:
        return len(self.current)

    def follow(self, item) -> bool:
        """Note that `item` is used now; True while this step still follows the record."""
        pos = len(self.current)
        self.current.append(item)
        if not self.diverged and self.record and (pos >= len(self.record)
                                                  or self.record[pos] != item):
            self.diverged = True
        return self.following

    @property
    def following(self) -> bool:
        return bool(self.record) and not self.diverged

    def upcoming(self) -> list:
        """What the record says comes after the items used so far."""
        return self.record[len(self.current):]

    def roll(self) -> bool:
        """End of a step: this step's order (if any) becomes the record. True when it
        differed from a previous record."""
        changed = bool(self.current) and bool(self.record) and self.current != self.record
        if self.current:
            self.record = self.current
        self.current = []
        self.diverged = False
        return changed



class PrefetchScheduler:
    def __init__(self, unit_numels: list[int], *, enabled: bool, prefetch_numel: int,
                 max_live_numel: int):
        self.unit_numels = unit_numels
        self.enabled = enabled
        self.prefetch_numel = prefetch_numel
        self.max_live_numel = max_live_numel
        self.forward = RecordedOrder()
        self.backward = RecordedOrder()
        self.inference = RecordedOrder()
        """Forwards without autograd (eval / no_grad) have an order of their own."""
        self.order_changes = 0
        """How many times a step's order differed from the record (for tests and logs)."""

    def first_units(self, phase: RecordedOrder, is_live, live_numel: int,
                    in_flight_numel: int) -> list[int]:
        """Units to prefetch before `phase` starts (e.g. backward's first units while the
        loss is computed), from the same budgets."""
        if not self.enabled or not phase.record or phase.current:
            return []
        return self._picks(phase.record, -1, is_live, live_numel, in_flight_numel)

    def on_use(self, phase: RecordedOrder, unit_index: int, is_live, live_numel: int,
               in_flight_numel: int) -> list[int]:
        """Note that `unit_index` is needed now; return units to prefetch (in order).

        `is_live(i)` says whether unit i is already gathered or gathering; `live_numel` and
        `in_flight_numel` are the engine's current accounting.
        """
        pos = phase.position()
        was_diverged = phase.diverged
        phase.follow(unit_index)
        if phase.diverged and not was_diverged:
            logger.debug("zerolite: unit order changed at position %d (unit %d, expected "
                         "%s); gathering on demand until the next step", pos, unit_index,
                         phase.record[pos] if pos < len(phase.record) else "end")
        if not self.enabled or phase.diverged or not phase.record:
            return []
        return self._picks(phase.record, pos, is_live, live_numel, in_flight_numel, unit_index)

    def _picks(self, record: list[int], pos: int, is_live, live_numel: int,
               in_flight_numel: int, current: int = -1) -> list[int]:
        picks, budget_ahead = [], self.prefetch_numel - in_flight_numel
        live = live_numel
        for nxt in record[pos + 1:]:
            if nxt == current or nxt in picks:
                continue
            if is_live(nxt):
                continue
            size = self.unit_numels[nxt]
            # Whenever prefetch is on, the next unit may always come early (budgets smaller
            # than one unit, like Hugging Face's "auto" 0.9 * hidden**2, would otherwise
            # turn prefetch off); the live budget still applies.
            first = not picks and in_flight_numel <= 0
            if (size > budget_ahead and not first) or live + size > self.max_live_numel:
                break
            picks.append(nxt)
            budget_ahead -= size
            live += size
        return picks

    def end_step(self) -> None:
        """Roll the recorded orders over (called once backward is complete)."""
        for phase in (self.forward, self.backward):
            self.order_changes += phase.roll()

    @property
    def phases(self) -> tuple[RecordedOrder, RecordedOrder, RecordedOrder]:
        return self.forward, self.backward, self.inference

    def trace_complete(self) -> bool:
        """Some phase has a recorded order to follow (DeepSpeed's "complete" trace)."""
        return any(phase.record for phase in self.phases)

    def forget(self) -> None:
        """Drop every recorded order and the one being recorded: the next forward and
        backward gather on demand and record afresh (DeepSpeed's trace invalidation)."""
        for phase in self.phases:
            phase.record, phase.current, phase.diverged = [], [], False

    def end_inference(self) -> None:
        """A forward without autograd ended: roll its own record, not the training one."""
        self.inference.roll()
