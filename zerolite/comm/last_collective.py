"""Where this rank is in the collective sequence, for the watchdog (zerolite/watchdog/).

Every zerolite collective wrapper calls `entered(kind)` first. It is on the hot path, so it
only stores two attributes and bumps a counter: no clock, no lock. The watchdog thread samples
`RECORD.seq` once per heartbeat; a counter that stopped moving is what "no progress" means.
The unit and phase are set by the code that knows them (the unit gathering or reducing, the
engine entering forward/backward/step), also as plain attribute stores.
"""
from __future__ import annotations


class CollectiveRecord:
    __slots__ = ("seq", "kind", "unit", "next_unit", "phase", "step")

    def __init__(self):
        self.seq = 0
        """Collectives entered (plus engine phase changes): the progress counter."""
        self.kind = ""
        """Last collective entered: all_gather, reduce_scatter, all_reduce, broadcast."""
        self.unit = ""
        """Unit whose parameters or gradients it moves ('' outside a unit)."""
        self.next_unit = ""
        """Set by a unit right before it calls a collective; taken by `entered`."""
        self.phase = "setup"
        """Engine phase: setup, forward, backward, step, checkpoint."""
        self.step = 0
        """Optimizer steps completed."""

    def describe(self) -> str:
        done = f"after {self.step} optimizer step(s)"
        if not self.kind:
            return f"none yet (in {self.phase}, {done})"
        unit = f" of unit {self.unit!r}" if self.unit else ""
        return f"{self.kind}{unit} in {self.phase}, {done} (event #{self.seq})"


RECORD = CollectiveRecord()


def entered(kind: str) -> None:
    RECORD.kind = kind
    RECORD.unit, RECORD.next_unit = RECORD.next_unit, ""
    RECORD.seq += 1


def set_phase(phase: str) -> None:
    RECORD.phase = phase
    RECORD.seq += 1
