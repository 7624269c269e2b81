"""The watchdog's decision, as a pure function of what the heartbeats say (no I/O here).

A heartbeat is what one rank last published (`Beat`); `age_s` is how long the monitoring rank
has seen that heartbeat unchanged, on its own monotonic clock, so clocks of different hosts
never get compared. Three faults, in this order of precedence:

- failed:  a rank raised and said so before exiting;
- stopped: a rank's heartbeat is older than the heartbeat limit (SIGSTOP, a frozen process,
           a dead host);
- hung:    some rank made no progress (entered no collective, started no engine phase) for
           longer than max(floor, factor x the slowest step any rank has seen). Named is the
           rank that is behind: the fewest events (collectives + phases) entered, i.e. the
           one the others wait for (stuck in compute, or it skipped a collective); with equal
           counts, the one idle longest. Until every rank has finished two
           steps (imports, model construction, first-step warm-up: the first step is not
           counted as a step time) the limit is WARMUP_FACTOR times larger.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

WARMUP_FACTOR = 4.0
"""Note: measured under load (2 cores, 8 runnable processes): a lazy `import torch._dynamo`
inside optimizer construction alone took 8 s without a collective; the first step gets room."""


@dataclass
class Settings:
    heartbeat_timeout_s: float = 20.0
    stall_timeout_s: float = 45.0
    stall_step_factor: float = 5.0
    interval_s: float = 1.0

    def stall_limit(self, slowest_step_s: float, warm: bool = True) -> float:
        limit = max(self.stall_timeout_s, self.stall_step_factor * slowest_step_s)
        return limit if warm else WARMUP_FACTOR * limit


@dataclass
class Beat:
    rank: int
    host: str
    pid: int
    beat: int
    """Heartbeat counter: changes every interval while the watchdog thread runs."""
    idle_s: float
    """Seconds since this rank last made progress, when it wrote this beat."""
    where: str
    """Its last collective: kind, unit, phase, step (last_collective.describe())."""
    slowest_step_s: float = 0.0
    steps: int = 0
    """Optimizer steps it completed."""
    events: int = 0
    """Collectives and engine phases it entered (last_collective.RECORD.seq)."""
    state: str = "running"
    """running, suspended (checkpoint I/O: no stall check), done (exited normally), failed."""
    error: str = ""

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: bytes | str) -> "Beat":
        return cls(**json.loads(raw))

    def who(self) -> str:
        return f"rank {self.rank} (host {self.host}, pid {self.pid})"


def judge(beats: dict[int, Beat], age_s: dict[int, float], settings: Settings,
          missing: list[int] = ()) -> str | None:
    """The verdict line (without the reporting rank's prefix), or None while all is well.

    `missing`: ranks that never published a heartbeat within the heartbeat limit.
    """
    for beat in sorted(beats.values(), key=lambda b: b.rank):
        if beat.state == "failed":
            return f"{beat.who()} failed: {beat.error}; last collective: {beat.where}"
    if missing:
        return (f"rank {missing[0]} never sent a heartbeat within "
                f"{settings.heartbeat_timeout_s:.0f}s of start (hung or not started)")
    live = [b for b in beats.values() if b.state != "done"]
    stale = [b for b in live if age_s.get(b.rank, 0.0) > settings.heartbeat_timeout_s]
    if stale:
        b = max(stale, key=lambda b: age_s[b.rank])
        return (f"{b.who()} stopped responding: no heartbeat for {age_s[b.rank]:.0f}s "
                f"(stopped, frozen or its host is gone); last collective (as of its last "
                f"heartbeat): {b.where}")
    if not live or any(b.state == "suspended" for b in live):
        return None
    limit = settings.stall_limit(max(b.slowest_step_s for b in beats.values()),
                                 warm=min(b.steps for b in live) >= 2)
    idle = {b.rank: b.idle_s + age_s.get(b.rank, 0.0) for b in live}
    if max(idle.values()) <= limit:
        return None
    culprit = min(live, key=lambda b: (b.events, -idle[b.rank], b.rank))
    others = "; ".join(f"rank {b.rank}: {b.where}" for b in sorted(live, key=lambda b: b.rank)
                       if b.rank != culprit.rank)
    return (f"{culprit.who()} hung: no progress for {idle[culprit.rank]:.0f}s "
            f"(limit {limit:.0f}s) after {culprit.where}" + (f"; others: {others}" if others else ""))
