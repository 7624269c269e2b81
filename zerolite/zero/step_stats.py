"""Per-step accounting of communication vs compute, for logs, benchmarks and timelines.

all_gather_s      sum over gathers of issue -> completion seen (an upper bound, see poll)
all_gather_wait_s time compute was blocked waiting for a gather (exposed)
reduce_scatter_s  sum over reductions of issue -> wait returned (an upper bound: gloo's
                  reduce-scatter work has no completion future)
reduce_scatter_wait_s  time blocked in those waits (exposed)
all_gather_stream_s / reduce_stream_s  time the side streams spent on each submit (from
                  after its "consumed" wait to its "ready" event); see below
Note: on CUDA the host runs ahead of the GPU, so host clocks say nothing about the GPU:
the *_wait_s are CUDA events on the compute stream around each wait (how long compute
stalled) and the *_stream_s are events on the side streams, read at the end of the step.
On CPU both are the host clock (the device layer's timers), as before.
peak_live_bytes   most full-parameter bytes gathered at once
reduce_bytes / all_gather_bytes  bytes this rank handed to the gradient-reduce / parameter-
                  gather collectives for other ranks in the step (the reducer's and gatherer's
                  `bytes_sent`, filled by the engine): measured from the tensors sent, so
                  compression (qgZ, top-k sparse gradients) shows as it is; all_gather_bytes
                  includes hpZ's gathers from secondary shards
secondary_gather_bytes  the part of all_gather_bytes gathered from hpZ secondary shards,
                  inside this rank's hpZ group (one node)
inter_node_bytes  the part of reduce_bytes + all_gather_bytes addressed to ranks on other
                  nodes (comm/wire_count.py: by destination; 0 on one node)
bytes_by_collective / inter_node_bytes_by_collective  the same per collective label
                  ("all_gather", "secondary_all_gather", "all_to_all", "reduce_scatter", ...)
peak_secondary_bytes  most hpZ secondary-shard bytes held at once
compute_s         forward + backward time of the step minus the exposed waits above
                  (filled by the engine at the optimizer step)
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from zerolite.device.layer import DeviceLayer


@dataclass
class StepStats:
    all_gather_s: float = 0.0
    all_gather_wait_s: float = 0.0
    reduce_scatter_s: float = 0.0
    reduce_scatter_wait_s: float = 0.0
    gathers: int = 0
    prefetched: int = 0
    peak_live_bytes: int = 0
    compute_s: float = 0.0
    all_gather_stream_s: float = 0.0
    reduce_stream_s: float = 0.0
    reduce_bytes: int = 0
    all_gather_bytes: int = 0
    secondary_gather_bytes: int = 0
    inter_node_bytes: int = 0
    bytes_by_collective: dict = field(default_factory=dict)
    inter_node_bytes_by_collective: dict = field(default_factory=dict)
    peak_secondary_bytes: int = 0
    events: list = field(default_factory=list)
    """(lane, name, start_s, end_s) when tracing is on."""

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("events")
        return d


class StatsRecorder:
    def __init__(self, trace: bool = False, layer: DeviceLayer | None = None):
        self.trace = trace
        self.layer = layer if layer is not None else DeviceLayer("cpu")
        self.t0 = time.perf_counter()
        self.current = StepStats()
        self.last = StepStats()
        self._pending: list = []
        self._timed: list = []

    @contextmanager
    def timed_wait(self, field_name: str):
        """Add the time compute spends inside the block to `field_name` (at end_step)."""
        timer = self.layer.timer().start()
        try:
            yield
        finally:
            self._timed.append((self.current, field_name, timer.stop()))

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def event(self, lane: str, name: str, start: float, end: float) -> None:
        if self.trace:
            self.current.events.append((lane, name, start, end))

    def track_gather(self, name: str, works: list) -> None:
        """Note an issued gather; its completion is observed by `poll()`.

        [Note: polling, not callbacks] Completion callbacks on gloo futures
        (`get_future().then`) made processes abort at interpreter exit ("terminate called
        without an active exception") when the script never destroyed its process group,
        as DeepSpeed-style scripts don't. Polling `is_completed()` at every hook is
        thread-free; a completion is seen at the next hook, so all_gather_s is an upper bound
        by at most one unit's compute.
        """
        self.current.gathers += 1
        pending = [w for w in works if w is not None and hasattr(w, "is_completed")]
        if pending:
            self._pending.append((self.now(), name, pending, self.current))

    def poll(self) -> None:
        if not self._pending:
            return
        still = []
        for item in self._pending:
            start, name, works, stats = item
            if all(w.is_completed() for w in works):
                end = self.now()
                stats.all_gather_s += end - start
                if self.trace:
                    stats.events.append(("comm", f"all_gather {name}", start, end))
            else:
                still.append(item)
        self._pending = still

    def end_step(self) -> StepStats:
        self.poll()
        for stats, name, timer in self._timed:
            setattr(stats, name, getattr(stats, name) + timer.seconds())
        self._timed = []
        layer, cur = self.layer, self.current
        cur.all_gather_stream_s += sum(s for _, s in layer.side_seconds(layer.gather))
        cur.reduce_stream_s += sum(s for _, s in layer.side_seconds(layer.reduce))
        self.last, self.current = self.current, StepStats()
        return self.last
