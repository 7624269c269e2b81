"""The device layer: an all-gather stream and a reduce stream, and the ordering rules
between them and the compute stream, written once for every device.

Rules (each one is an event wait; tests/test_device_layer.py drops each in turn):

  consumed  A side stream's work waits for an event recorded on the compute stream when the
            work is submitted. Everything compute has issued so far -- the optimizer's
            update of the shards it reads, and every read of a full buffer that was
            released before this submit -- is then done before the side stream writes.
            Full buffers are allocated inside the side stream's context, so the caching
            allocator hands a freed block back only to that side stream, whose next write
            is ordered after this wait.
  ready     When the side stream's work (collective + its finishing step, e.g. qwZ
            dequantization or qgZ dequantize-sum) is done, a "ready" event is recorded on
            the side stream; `Ticket.wait()` makes the compute stream wait for it before
            the result is used.
  consumed  (again) A finishing step deferred to `Ticket.wait()` (gloo, below) first waits
  (late)    for compute once more: it may allocate (dequantize into a fresh buffer), and a
            block freed since the submit could still be read by compute work issued after it.
  keep      Buffers the side stream reads but compute allocated (a full gradient buffer)
            are held by the ticket until the compute stream has waited for "ready": only
            then can a compute-stream allocation reuse their memory.

[Note: eager vs deferred completion] On NCCL, `work.wait()` only orders the current stream
after the collective, so the ticket calls it (and the finishing step) right at submit time,
on the side stream: dequantization overlaps compute too. On gloo (CPU tensors, or CUDA
tensors on a one-GPU box) `work.wait()` blocks the host, so it is deferred to
`Ticket.wait()`, where it still runs in the side stream's context.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch

from zerolite.device.backends import backend_for


class Ticket:
    """One piece of side-stream work; `wait()` returns its result, ready for compute."""

    def __init__(self, side: "SideStream", works: list, value: Any, finish, keep: tuple,
                 name: str, begin):
        self._side, self._works, self._value, self._finish = side, works, value, finish
        self._keep = keep
        self.name, self._begin = name, begin
        self._ready = None
        self._result = None
        self._done_on_side = False
        self._waited = False

    def _complete_on_side(self, at_submit: bool = False) -> None:
        backend = self._side.backend
        late = None if at_submit else backend.record()  # see "consumed (late)"
        with backend.use_stream(self._side.stream):
            if late is not None:
                backend.wait(late, self._side.stream)
            for work in self._works:
                work.wait()
            self._result = self._finish(self._value) if self._finish else self._value
            self._ready = backend.record(self._side.stream)
            self._side.marks.append((self.name, self._begin, backend.mark(self._side.stream)))
        self._done_on_side = True

    def is_completed(self) -> bool:
        """Has the work finished? (never blocks)."""
        if self._done_on_side:
            return self._side.backend.query(self._ready)
        return all(w.is_completed() for w in self._works)

    def wait(self):
        """Make the compute stream wait for the result, then return it."""
        if not self._waited:
            if not self._done_on_side:
                self._complete_on_side()
            self._side.backend.wait(self._ready)
            self._waited = True
            self._keep = ()  # compute is now ordered after the side stream's reads
        return self._result


class SideStream:
    """A stream that collectives (and their pre/post steps) run on, off the compute stream."""

    def __init__(self, backend, name: str, eager: bool, group=None):
        self.backend = backend
        self.name = name
        self.eager = eager
        self.group = group
        """Process group for this stream's collectives (None: the default group)."""
        self.stream = backend.new_stream(name)
        self.submitted = 0
        """Submits so far (tests and telemetry)."""
        self.marks: deque = deque(maxlen=4096)
        """(name, start mark, end mark) of finished submits, drained by
        DeviceLayer.side_seconds at each step; bounded for loops that never step (eval)."""

    def submit(self, start: Callable[[], tuple[list, Any]], finish: Callable[[Any], Any] | None
               = None, keep: tuple = (), name: str = "") -> Ticket:
        """Run `start()` -> (works, value) on this stream after compute's work so far;
        `finish(value)` runs on this stream once the works are done (eagerly on NCCL)."""
        backend = self.backend
        consumed = backend.record()  # on the compute stream: see "consumed" above
        with backend.use_stream(self.stream):
            backend.wait(consumed, self.stream)
            begin = backend.mark(self.stream)
            works, value = start()
        ticket = Ticket(self, [w for w in works if w is not None], value, finish, keep, name,
                        begin)
        self.submitted += 1
        if self.eager:
            ticket._complete_on_side(at_submit=True)
        return ticket


class Timer:
    """Time between start() and stop() on the compute stream: CUDA events on GPU (what the
    GPU did, not when the host queued it), the host clock on CPU. Read after the step."""

    def __init__(self, backend):
        self.backend = backend
        self._start = self._end = None

    def start(self) -> "Timer":
        self._start = self.backend.mark()
        return self

    def stop(self) -> "Timer":
        self._end = self.backend.mark()
        return self

    def seconds(self) -> float:
        if self._start is None or self._end is None:
            return 0.0
        return self.backend.seconds_between(self._start, self._end)


class DeviceLayer:
    """What the engine needs from its device: where tensors live, two side streams, timers,
    synchronize and memory figures."""

    def __init__(self, device: torch.device | str, *, eager: bool | None = None, backend=None,
                 gather_group=None, reduce_group=None):
        self.backend = backend if backend is not None else backend_for(device)
        self.device = torch.device(device)
        if eager is None:
            eager = self.backend.kind == "cuda" and _default_backend_is_nccl()
        self.gather = SideStream(self.backend, "all_gather", eager, gather_group)
        self.reduce = SideStream(self.backend, "reduce", eager, reduce_group)

    @property
    def kind(self) -> str:
        return self.backend.kind

    def timer(self) -> Timer:
        return Timer(self.backend)

    def synchronize(self) -> None:
        self.backend.synchronize()

    def memory_stats(self) -> dict:
        return self.backend.memory_stats()

    def side_seconds(self, side: SideStream) -> list[tuple[str, float]]:
        """(name, seconds) of each finished submit on `side` since the last call."""
        marks, side.marks = list(side.marks), deque(maxlen=side.marks.maxlen)
        return [(n, self.backend.seconds_between(a, b)) for n, a, b in marks]


def _default_backend_is_nccl() -> bool:
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    backend = str(dist.get_backend())  # "nccl", "gloo" or e.g. "cpu:gloo,cuda:nccl"
    return backend == "nccl" or "cuda:nccl" in backend
