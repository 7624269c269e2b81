"""Bytes this rank hands to collectives for other ranks, and the part of them addressed to
ranks on other nodes.

Totals follow `collectives.wire_bytes` (the bandwidth-optimal algorithm's bytes per rank).
The inter-node part counts by destination: an all-gather sends this rank's contribution to
every member of the group, so the members on other nodes get `nbytes` each; a
reduce-scatter / all-to-all sends chunk r of the buffer to member r, so the chunks of members
on other nodes cross; an all-reduce is a reduce-scatter then an all-gather of those chunks.
What a real ring or tree then routes through which link is the library's business: this is
the data whose owner sits on another node, which no algorithm can avoid moving there.
[Note: vs the step-time model] zerolite/plan.py splits ring collectives by rails (1/g of a
GPU's ring bytes cross, g ranks per node); this counter gives (N - g) / (N - 1) of an
all-gather over N ranks. The totals are the same; tests/test_plan.py checks both.
"""
from __future__ import annotations

from collections import Counter

from zerolite.comm.collectives import wire_bytes
from zerolite.comm.topology import NodeLayout


class WireCounter:
    """`sent[label]` and `inter_node[label]`: bytes by collective label (e.g. "all_gather",
    "secondary_all_gather", "all_to_all"), cumulative; readers take differences."""

    def __init__(self, layout: NodeLayout | None = None, rank: int = 0):
        self.layout, self.rank = layout, rank
        self.sent: Counter = Counter()
        self.inter_node: Counter = Counter()

    def add(self, label: str, kind: str, nbytes: int, group_ranks=None, world: int = 0) -> None:
        """One collective of `kind` (as in wire_bytes) over `group_ranks` (None: all `world`
        ranks). `nbytes`: this rank's contribution for all_gather, the full buffer for the
        reductions."""
        n = len(group_ranks) if group_ranks is not None else world
        self.sent[label] += wire_bytes(kind, nbytes, n)
        if self.layout is None or n <= 1:
            return
        far = self.layout.on_other_nodes(self.rank, group_ranks)
        if kind == "all_gather":
            self.inter_node[label] += nbytes * far
        elif kind in ("reduce_scatter", "all_to_all"):
            self.inter_node[label] += nbytes // n * far
        elif kind == "all_reduce":
            self.inter_node[label] += 2 * (nbytes // n) * far
        else:
            raise ValueError(f"unknown collective kind {kind!r}")

    def add_to_ranks(self, label: str, own_rank: int, bytes_to: dict[int, int]) -> None:
        """A collective whose bytes per destination rank are known (top-k sparse payloads);
        what `own_rank` addresses to itself stays off the wire."""
        for dest, nbytes in bytes_to.items():
            if dest == own_rank:
                continue
            self.sent[label] += nbytes
            if self.layout is not None and self.layout.node_of(dest) != \
                    self.layout.node_of(own_rank):
                self.inter_node[label] += nbytes
