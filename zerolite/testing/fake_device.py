"""A device backend that records stream operations instead of running them, and a
happens-before check over the record: tests of the device layer's ordering rules.

Streams are names ("compute", "all_gather", "reduce"); the log holds
("op", stream, name), ("record", stream, event) and ("wait", stream, event) in issue
order. Entry a happens before entry b when a path leads from a to b along one stream's
issue order or from an event's record to a wait for it -- what a GPU guarantees. The
stream "host" is the host itself: what it did happens before everything issued after it
(an operation enqueued later sees the host's writes), and its waits block it.
"""
from __future__ import annotations

import contextlib
import itertools


class FakeWork:
    """A collective issued on the current stream of a RecordingBackend."""

    def __init__(self, backend: "RecordingBackend", name: str):
        self.backend, self.name = backend, name
        self.index = backend.op(name)
        self.waited_on: list[str] = []

    def wait(self):
        # Like NCCL's work.wait(): the *current* stream waits for the collective.
        self.backend.log.append(("wait_work", self.backend.current_stream(), self.index))
        self.waited_on.append(self.backend.current_stream())

    def is_completed(self) -> bool:
        return False


class RecordingBackend:
    kind = "fake"

    def __init__(self):
        self.log: list[tuple] = []
        self._stack = ["compute"]
        self._ids = itertools.count()

    # -- backend interface ------------------------------------------------------------
    def new_stream(self, name: str):
        return name

    def current_stream(self):
        return self._stack[-1]

    @contextlib.contextmanager
    def use_stream(self, stream):
        self._stack.append(stream if stream is not None else self._stack[-1])
        try:
            yield
        finally:
            self._stack.pop()

    def record(self, stream=None):
        event = f"e{next(self._ids)}"
        self.log.append(("record", stream or self.current_stream(), event))
        return event

    def wait(self, event, stream=None) -> None:
        self.log.append(("wait", stream or self.current_stream(), event))

    def query(self, event) -> bool:
        return False

    def mark(self, stream=None):
        return len(self.log)

    def seconds_between(self, start, end) -> float:
        return float(end - start)

    def synchronize(self) -> None:
        pass

    def copy(self, dst, src, name: str = "") -> None:
        self.op(name or "copy")
        dst.copy_(src)

    def host_wait(self, event) -> None:
        self.log.append(("wait", "host", event))

    def host_empty(self, numel, dtype, pin):
        import torch

        return torch.empty(numel, dtype=dtype)

    def memory_stats(self) -> dict:
        return {}

    # -- test helpers -----------------------------------------------------------------
    def op(self, name: str) -> int:
        """Log an operation on the current stream; returns its log index."""
        self.log.append(("op", self.current_stream(), name))
        return len(self.log) - 1

    def index_of(self, name: str, nth: int = 0) -> int:
        hits = [i for i, e in enumerate(self.log) if e[0] == "op" and e[2] == name]
        return hits[nth]

    def happens_before(self, a: int, b: int) -> bool:
        """Is log entry a ordered before entry b on the device?"""
        edges: dict[int, list[int]] = {}
        last_on: dict[str, int] = {}
        recorded: dict[str, int] = {}
        for i, entry in enumerate(self.log):
            kind, stream, what = entry
            if stream in last_on:
                edges.setdefault(last_on[stream], []).append(i)
            if "host" in last_on and stream != "host":
                edges.setdefault(last_on["host"], []).append(i)  # issued after the host's work
            last_on[stream] = i
            if kind == "record":
                recorded[what] = i
            elif kind == "wait" and what in recorded:
                edges.setdefault(recorded[what], []).append(i)
            elif kind == "wait_work":  # the collective's completion -> this wait
                edges.setdefault(what, []).append(i)
        todo, seen = [a], {a}
        while todo:
            node = todo.pop()
            if node == b:
                return True
            for nxt in edges.get(node, []):
                if nxt not in seen and nxt <= b:
                    seen.add(nxt)
                    todo.append(nxt)
        return False
