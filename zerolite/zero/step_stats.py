"""Per-step accounting of communication vs compute, for logs, benchmarks and timelines.

all_gather_s      sum over gathers of issue -> completion (the communication itself)
all_gather_wait_s time the compute thread was blocked waiting for a gather (exposed)
reduce_scatter_s  sum over reductions of issue -> wait returned (an upper bound: gloo's
                  reduce-scatter work has no completion future)
reduce_scatter_wait_s  time blocked in those waits (exposed)
peak_live_bytes   most full-parameter bytes gathered at once
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field


@dataclass
class StepStats:
    all_gather_s: float = 0.0
    all_gather_wait_s: float = 0.0
    reduce_scatter_s: float = 0.0
    reduce_scatter_wait_s: float = 0.0
    gathers: int = 0
    prefetched: int = 0
    peak_live_bytes: int = 0
    events: list = field(default_factory=list)
    """(lane, name, start_s, end_s) when tracing is on."""

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("events")
        return d


class StatsRecorder:
    def __init__(self, trace: bool = False):
        self.trace = trace
        self.t0 = time.perf_counter()
        self.current = StepStats()
        self.last = StepStats()
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def event(self, lane: str, name: str, start: float, end: float) -> None:
        if self.trace:
            with self._lock:
                self.current.events.append((lane, name, start, end))

    def track_gather(self, name: str, works: list) -> None:
        """Record when each async gather completes (gloo all-gather works have futures)."""
        start = self.now()
        stats = self.current
        stats.gathers += 1
        pending = [w for w in works if w is not None and hasattr(w, "get_future")]
        if not pending:
            return
        remaining = [len(pending)]

        def done(_fut):
            with self._lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    end = self.now()
                    stats.all_gather_s += end - start
                    if self.trace:
                        stats.events.append(("comm", f"all_gather {name}", start, end))
            return None

        for w in pending:
            w.get_future().then(done)

    def end_step(self) -> StepStats:
        self.last, self.current = self.current, StepStats()
        return self.last
