"""Partition math: how a flat of `numel` elements is split over `partitions` ranks.

The bottom layer of `zero/` (no torch.distributed, no other zerolite module). Every flat
buffer — a unit's FlatParam or one zero.Init-partitioned parameter — is padded to
`shard_numel * partitions` elements and rank r owns the contiguous range
`[r * shard_numel, (r + 1) * shard_numel)`. Everything that slices "this rank's part" asks
`rank_range` / `overlap` instead of redoing the arithmetic.

`reference_shards` is the naive twin (split a full tensor into every rank's shard in one
process); tests check the ranged slicing and the collective gather against it.
"""
from __future__ import annotations

import math

import torch


def shard_numel(numel: int, partitions: int) -> int:
    """Elements each rank holds (at least 1, so an empty flat still has a shard)."""
    return max(1, math.ceil(numel / partitions))


def rank_range(rank: int, shard: int, limit: int | None = None) -> tuple[int, int]:
    """[lo, hi) of rank `rank`'s slice in flat coordinates; clipped to `limit` if given."""
    lo, hi = rank * shard, (rank + 1) * shard
    if limit is not None:
        lo, hi = min(lo, limit), min(hi, limit)
    return lo, hi


def overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """Intersection of two [lo, hi) ranges, or None when they do not meet."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def reference_shards(full: torch.Tensor, partitions: int) -> list[torch.Tensor]:
    """Naive reference: pad a flattened `full` with zeros and cut it into equal shards."""
    flat = full.reshape(-1)
    n = shard_numel(flat.numel(), partitions)
    padded = torch.zeros(n * partitions, dtype=flat.dtype, device=flat.device)
    padded[:flat.numel()] = flat
    return list(padded.split(n))
