"""Thin wrappers over torch.distributed collectives.

torch 2.13 renamed `all_gather_into_tensor`/`reduce_scatter_tensor` to `all_gather_single`/
`reduce_scatter_single`; we call the new names where they exist and fall back otherwise, so
`torch>=2.3` works. Every call is labelled with `record_function` for profiler timelines.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _DoneWork:
    """Stand-in for a finished work handle (world size 1 needs no communication)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def wire_bytes(kind: str, nbytes: int, world: int) -> int:
    """Bytes one rank sends for collective `kind` by the bandwidth-optimal algorithm.

    `nbytes` is the full buffer for reductions (all_reduce, reduce_scatter, all_to_all) and
    this rank's contribution for all_gather. Ring all-reduce sends 2(N-1)/N of the buffer
    (a reduce-scatter then an all-gather); reduce-scatter and all_to_all send the N-1 chunks
    that belong to other ranks; all-gather sends this rank's chunk to N-1 ranks.
    """
    if world <= 1:
        return 0
    if kind == "all_reduce":
        return 2 * (world - 1) * nbytes // world
    if kind in ("reduce_scatter", "all_to_all"):
        return (world - 1) * nbytes // world
    if kind == "all_gather":
        return (world - 1) * nbytes
    raise ValueError(f"unknown collective kind {kind!r}")


def all_to_all_flat(output: torch.Tensor, full: torch.Tensor, group=None, async_op=False):
    """Chunk r of `full` goes to rank r; `output` receives every rank's chunk, rank order."""
    with record_function("zerolite::all_to_all"):
        if dist.get_world_size(group) == 1:
            output.copy_(full)
            return _DoneWork() if async_op else None
        return dist.all_to_all_single(output, full, group=group, async_op=async_op)


def all_gather_flat(output: torch.Tensor, shard: torch.Tensor, group=None, async_op=False):
    """Concatenate every rank's equal-sized `shard` into `output` (rank order)."""
    with record_function("zerolite::all_gather"):
        if dist.get_world_size(group) == 1:
            output.copy_(shard)
            return _DoneWork() if async_op else None
        return _all_gather_flat(output, shard, group=group, async_op=async_op)


def start_full_flat_gather(out: torch.Tensor, shard: torch.Tensor, partitions: int,
                           group=None):
    """Start filling `out` (a flat's full padded buffer) from every rank's equal `shard`.

    `partitions == 1` means nothing is sharded (stage 0, world 1): the shard already is the
    full buffer and is copied, unless `out` is the shard itself (FlatParam.full_is_shard). Returns the work handle to wait on, or None when nothing is in
    flight. This is the one full-flat gather: unit gathers, state dicts, 16-bit checkpoints
    and zero.Init slices all go through it.
    """
    if partitions == 1:
        if out.data_ptr() != shard.data_ptr():  # a flat's full buffer may be its shard
            out.copy_(shard)
        return None
    return all_gather_flat(out, shard.contiguous(), group=group, async_op=True)


def gather_full_flat(shard: torch.Tensor, partitions: int) -> torch.Tensor:
    """A new full padded flat gathered from every rank's `shard` (collective, blocking)."""
    out = torch.empty(shard.numel() * partitions, dtype=shard.dtype, device=shard.device)
    work = start_full_flat_gather(out, shard, partitions)
    if work is not None:
        work.wait()
    return out


def reduce_scatter_flat(output: torch.Tensor, full: torch.Tensor, group=None, async_op=False):
    """Sum `full` over ranks and leave slice `rank` of the sum in `output`."""
    with record_function("zerolite::reduce_scatter"):
        if dist.get_world_size(group) == 1:
            output.copy_(full)
            return _DoneWork() if async_op else None
        return _reduce_scatter_flat(output, full, op=dist.ReduceOp.SUM, group=group,
                                    async_op=async_op)


def all_reduce_sum(tensor: torch.Tensor, group=None, async_op=False):
    with record_function("zerolite::all_reduce"):
        if dist.get_world_size(group) == 1:
            return _DoneWork() if async_op else None
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, group=None):
    with record_function("zerolite::broadcast"):
        if dist.get_world_size(group) > 1:
            dist.broadcast(tensor, src=src, group=group)
