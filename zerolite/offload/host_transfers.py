"""Host <-> device copies of the host-resident masters, on one side stream of the device layer.

Ordering rules (tests/test_offload_cpu.py checks each on the recording backend):

  after     A copy waits for an event recorded on the compute stream when it is issued:
            a device->host copy of a reduced gradient shard is issued right after compute
            waited for that reduction's "ready" event, so the copy reads the finished shard;
            a host->device copy into a param shard comes after compute waited for every
            gather that read the old value.
  settle    The host waits for each copy's "done" event (`settle()`) before it reads what a
            device->host copy wrote (the optimizer step, the accumulation add) or rewrites
            what a host->device copy reads (the next step's update of the masters).
  visible   Compute waits for a host->device copy's "done" event right after issuing it, so
            every later gather (whose stream waits for compute) reads the new shard.
  keep      The device tensor a copy reads stays referenced until the host has waited for
            the copy, so the allocator cannot hand its memory out while it is being read.

On CPU the stream and events are no-ops and each copy is an ordinary synchronous copy_.
"""
from __future__ import annotations

from typing import Callable

import torch


class HostTransfers:
    def __init__(self, backend):
        self.backend = backend
        self.stream = backend.new_stream("host_copy")
        self._pending: list[tuple] = []
        """(done event, tensors kept alive, callback run once the host has waited)."""
        self.bytes_to_host = 0
        self.bytes_to_device = 0

    def _issue(self, dst: torch.Tensor, src: torch.Tensor, name: str):
        b = self.backend
        after = b.record()  # "after"
        with b.use_stream(self.stream):
            b.wait(after, self.stream)
            b.copy(dst, src, name=name)
            return b.record(self.stream)

    def to_host(self, dst: torch.Tensor, src: torch.Tensor, name: str = "",
                then: Callable[[], None] | None = None) -> None:
        """Start dst (host) <- src (device); `then()` runs on the host once it is done."""
        done = self._issue(dst, src, f"d2h {name}")
        self._pending.append((done, (src,), then))
        self.bytes_to_host += src.numel() * src.element_size()

    def to_device(self, dst: torch.Tensor, src: torch.Tensor, name: str = "") -> None:
        """Start dst (device) <- src (host); compute is ordered after it ("visible")."""
        done = self._issue(dst, src, f"h2d {name}")
        self.backend.wait(done)
        self._pending.append((done, (src,), None))
        self.bytes_to_device += src.numel() * src.element_size()

    def note_read(self, event, keep: tuple = ()) -> None:
        """A copy issued elsewhere (on the gather stream) reads host memory until `event`."""
        self._pending.append((event, keep, None))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def settle(self) -> None:
        """Block the host until every copy issued so far is done ("settle"), in issue order."""
        pending, self._pending = self._pending, []
        for done, _keep, then in pending:
            self.backend.host_wait(done)
            if then is not None:
                then()
