"""Which node each rank is on, and ZeRO++ hpZ's secondary groups built from it.

Ranks are node-major, as torchrun (and `zerolite --num_nodes ...`, which runs torchrun)
numbers them: node k holds ranks `[k * g, (k + 1) * g)`, g = LOCAL_WORLD_SIZE, the same g
on every node. Without LOCAL_WORLD_SIZE (plain `python`, a script's own
init_process_group) every rank is taken to be on one node.

hpZ (`zero_optimization.zero_hpz_partition_size` = h > 1): the ranks form groups of h
consecutive ranks, `[i * h, (i + 1) * h)`. With h dividing g every group lies inside one
node, so a gather inside a group never leaves the node.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from zerolite.errors import ZeroliteConfigError

HPZ_KEY = "zero_optimization.zero_hpz_partition_size"


@dataclass(frozen=True)
class NodeLayout:
    world_size: int
    ranks_per_node: int

    def __post_init__(self):
        if self.ranks_per_node < 1 or self.world_size % self.ranks_per_node:
            raise ZeroliteConfigError(
                f"LOCAL_WORLD_SIZE={self.ranks_per_node}: expected the same number of ranks "
                f"on every node, a divisor of the world size {self.world_size}")

    @classmethod
    def from_env(cls, world_size: int) -> "NodeLayout":
        """The layout torchrun set up (LOCAL_WORLD_SIZE); one node without it."""
        raw = os.environ.get("LOCAL_WORLD_SIZE")
        if raw is None:
            return cls(world_size, world_size)
        try:
            per_node = int(raw)
        except ValueError:
            raise ZeroliteConfigError(f"LOCAL_WORLD_SIZE={raw!r} is not a number of ranks") \
                from None
        return cls(world_size, per_node)

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def on_other_nodes(self, rank: int, ranks) -> int:
        """How many of `ranks` (None: every rank) sit on another node than `rank`."""
        if self.nodes == 1:
            return 0
        ranks = range(self.world_size) if ranks is None else ranks
        node = self.node_of(rank)
        return sum(self.node_of(r) != node for r in ranks)


@dataclass(frozen=True)
class SecondaryGroup:
    """This rank's hpZ group: `size` consecutive ranks, `position` of this rank in it."""

    size: int
    position: int
    ranks: tuple[int, ...]
    group: object
    """The torch.distributed process group of `ranks`."""


def check_hpz(hpz: int, layout: NodeLayout) -> None:
    """Refuse an hpZ size the node layout cannot hold (ZeroliteConfigError naming the key).
    The stage is the config's to check (config/sections.py): it needs no process group."""
    if hpz <= 1:
        return
    g = layout.ranks_per_node
    if g % hpz or layout.world_size % hpz:
        raise ZeroliteConfigError(
            f"{HPZ_KEY}={hpz} must divide the ranks per node ({g}, LOCAL_WORLD_SIZE) and the "
            f"world size ({layout.world_size}), so that every hpZ group lies inside one node; "
            f"use a divisor of {g}, or 1 to turn hpZ off")


def build_secondary_group(hpz: int, layout: NodeLayout, rank: int) -> SecondaryGroup | None:
    """This rank's hpZ group (None when hpz <= 1). Collective: every rank builds every group
    (torch.distributed.new_group's rule), in the same order."""
    if hpz <= 1:
        return None
    check_hpz(hpz, layout)
    mine = None
    for first in range(0, layout.world_size, hpz):
        ranks = tuple(range(first, first + hpz))
        group = dist.new_group(ranks=list(ranks))
        if rank in ranks:
            mine = SecondaryGroup(hpz, rank - first, ranks, group)
    return mine
