"""Stream/event primitives of one device kind: the only place that knows CUDA from CPU.

A backend answers a handful of questions (make a stream, record an event on a stream, make a
stream wait for an event, ask whether an event has happened, time between two marks).
`zerolite.device.layer` builds the ordering logic (side streams, tickets) on top of these,
once, for every device: engine code never branches on the device.

[Note: CPU is a no-op, not a special case] On CPU there are no streams: every primitive does
nothing, an event is always "done", and the overlap comes from gloo's asynchronous work
handles (`work.wait()` blocks the host). The same ticket logic then reduces to exactly the
host-side waits zerolite always did.
"""
from __future__ import annotations

import contextlib
import time

import psutil
import torch


class HostBackend:
    """CPU: no streams, no events; marks are host clock readings."""

    kind = "cpu"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def new_stream(self, name: str):
        return None

    def current_stream(self):
        return None

    def use_stream(self, stream):
        return contextlib.nullcontext()

    def record(self, stream=None):
        return None

    def wait(self, event, stream=None) -> None:
        return None

    def query(self, event) -> bool:
        return True

    def mark(self, stream=None):
        """A point in time on `stream` (host clock on CPU)."""
        return time.perf_counter()

    def seconds_between(self, start, end) -> float:
        return max(0.0, end - start)

    def synchronize(self) -> None:
        return None

    def copy(self, dst: torch.Tensor, src: torch.Tensor, name: str = "") -> None:
        """dst <- src (a host <-> device transfer), on the current stream."""
        dst.copy_(src)

    def host_wait(self, event) -> None:
        """Block the host until `event` has happened (the host then reads what it guards)."""
        return None

    def host_empty(self, numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
        """A host buffer; `pin` is ignored: pinning needs an accelerator to pin for."""
        return torch.empty(numel, dtype=dtype)

    def memory_stats(self) -> dict:
        return {"device": str(self.device), "rss": psutil.Process().memory_info().rss}


class CudaBackend:
    """CUDA: real side streams and events on `device`."""

    kind = "cuda"

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaBackend needs a cuda device, got {self.device}")

    def new_stream(self, name: str):
        # Note: same priority as compute; a high-priority gather stream starves reductions.
        return torch.cuda.Stream(device=self.device)

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def use_stream(self, stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def record(self, stream=None):
        event = torch.cuda.Event()
        event.record(stream if stream is not None else self.current_stream())
        return event

    def wait(self, event, stream=None) -> None:
        if event is not None:
            (stream if stream is not None else self.current_stream()).wait_event(event)

    def query(self, event) -> bool:
        return event is None or event.query()

    def mark(self, stream=None):
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream if stream is not None else self.current_stream())
        return event

    def seconds_between(self, start, end) -> float:
        end.synchronize()
        return max(0.0, start.elapsed_time(end) / 1e3)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    # Note: the three host-transfer primitives below have not run on a GPU yet (no GPU was
    # lent so far); tests/test_offload_cpu.py's cuda tests and gpu_check.py exercise them.
    def copy(self, dst: torch.Tensor, src: torch.Tensor, name: str = "") -> None:
        # Asynchronous only when the host side is pinned; pageable memory makes it a
        # synchronous copy, still correct.
        dst.copy_(src, non_blocking=True)

    def host_wait(self, event) -> None:
        if event is not None:
            event.synchronize()

    def host_empty(self, numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, pin_memory=pin)

    def memory_stats(self) -> dict:
        return {"device": str(self.device),
                "allocated": torch.cuda.memory_allocated(self.device),
                "reserved": torch.cuda.memory_reserved(self.device),
                "peak_allocated": torch.cuda.max_memory_allocated(self.device),
                "rss": psutil.Process().memory_info().rss}


def backend_for(device: torch.device | str):
    device = torch.device(device)
    if device.type == "cuda":
        return CudaBackend(device)
    if device.type == "cpu":
        return HostBackend(device)
    raise ValueError(f"zerolite runs on cpu or cuda devices, got {device}")
