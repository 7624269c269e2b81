"""Gradient reduction queue: full fp32 grad buffers -> averaged fp32 grad shards.

Reductions are launched asynchronously as each flat's grads are complete, so they overlap
with the backward of earlier units. At most `max_inflight_numel` elements of full gradient
buffers are alive in flight (DeepSpeed's reduce_bucket_size); past that the oldest is waited
for. Finished reductions are retired as soon as a hook sees them done (`poll`), so their
full-size buffers do not wait for the end of backward; everything left is waited for once,
at the end of backward.
"""
from __future__ import annotations

from collections import deque

from torch.autograd.profiler import record_function

from zerolite.zero.flat_param import FlatParam
from zerolite.zero.step_stats import StatsRecorder
from zerolite.zero.unit import Unit


class GradReduction:
    def __init__(self, reducer, *, max_inflight_numel: int, stats: StatsRecorder):
        self.reducer = reducer
        self.max_inflight_numel = max_inflight_numel
        self.stats = stats
        self._queue: deque = deque()
        self._inflight_numel = 0

    def poll(self) -> None:
        """Retire reductions that have finished (oldest first), freeing their buffers."""
        while self._queue and self._queue[0][0].is_completed():
            self._complete(self._queue.popleft())

    def launch(self, unit: Unit, flat: FlatParam) -> None:
        self.poll()
        unit.reduced_flats += 1
        item = unit.start_reduce(flat, self.reducer)
        if item is None:
            return
        self._queue.append((*item, self.stats.now(), unit.name))
        self._inflight_numel += flat.padded_numel
        # Always allow one in flight; beyond the budget, wait for the oldest.
        while len(self._queue) > 1 and self._inflight_numel > self.max_inflight_numel:
            self._complete(self._queue.popleft())

    def _complete(self, item) -> None:
        pending, flat, buf, start, name = item
        with self.stats.timed_wait("reduce_scatter_wait_s"), \
                record_function(f"zerolite::wait_reduce {name}"):
            shard = pending.wait()
        end = self.stats.now()
        self.stats.current.reduce_scatter_s += end - start
        self.stats.event("comm", f"reduce {name}", start, end)
        self._inflight_numel -= flat.padded_numel
        if shard.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
            flat.pool.give(buf)  # else the shard is the buffer itself (one partition)
        flat.take_grad_shard(shard, name)  # wherever the master lives (flat_placement.py)

    def drain(self, units: list[Unit]) -> None:
        """Launch what is left (params that got no grad count as zero) and wait for all."""
        for unit in reversed(units):
            for flat in unit.trainable_flats:
                if flat.grad_buffer is not None:
                    self.launch(unit, flat)
        while self._queue:
            self._complete(self._queue.popleft())
