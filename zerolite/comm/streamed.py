"""Gatherers and reducers whose work runs on the device layer's side streams.

`StreamedGatherer` issues a unit's all-gather (and, for qwZ, the quantization before it and
the dequantization after it) on the all-gather stream; `StreamedReducer` issues a
reduction (qgZ quantize, reduce-scatter / all-to-all, dequantize-sum, scaling) on the
reduce stream and keeps the full gradient buffer alive until compute has waited for the
result. Both return the device layer's Ticket, which has the `wait()` / `is_completed()`
the sharded model already calls, so `zero/` needs no device-specific code. On CPU every
stream operation is a no-op and the tickets wait exactly where the bare handles did.
"""
from __future__ import annotations

from zerolite.device.layer import DeviceLayer


class _Once:
    """An inner pending handle waited for once; its result kept (tickets may wait again)."""

    def __init__(self, pending):
        self.pending = pending
        self.result = None
        self._done = pending is None

    def wait(self):
        if not self._done:
            self.result = self.pending.wait()
            self._done = True
        return self.result

    def is_completed(self) -> bool:
        return self._done or self.pending.is_completed()


def _result(once: _Once):
    return once.result


class StreamedGatherer:
    def __init__(self, inner, layer: DeviceLayer):
        self.inner, self.layer = inner, layer

    @property
    def bytes_sent(self):
        return self.inner.bytes_sent

    @property
    def wire(self):
        return self.inner.wire

    def start(self, flat, fetch: bool = False):
        def issue():
            once = _Once(self.inner.start(flat, fetch=fetch))
            return [once], once

        return self.layer.gather.submit(issue, finish=_result, name="all_gather")


class StreamedReducer:
    def __init__(self, inner, layer: DeviceLayer):
        self.inner, self.layer = inner, layer

    def __getattr__(self, name):  # world_size, bytes_sent, residual(), ... of the inner one
        return getattr(self.__dict__["inner"], name)

    def start(self, flat, full_grad):
        def issue():
            once = _Once(self.inner.start(flat, full_grad))
            return [once], once

        return self.layer.reduce.submit(issue, finish=_result, keep=(full_grad,), name="reduce")
