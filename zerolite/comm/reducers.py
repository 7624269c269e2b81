"""Gradient reduction and parameter gathering strategies for one FlatParam.

The sharded model asks a GradReducer to turn a full fp32 gradient buffer into this rank's
averaged fp32 gradient shard, and a ParamGatherer to fill a full parameter buffer from the
shards. Variants (16-bit communication, quantized ZeRO++-style reductions) subclass these;
the sharded model does not know which one it runs.
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from zerolite.comm.collectives import (all_reduce_sum, all_to_all_flat, reduce_scatter_flat,
                                       start_full_flat_gather)
from zerolite.comm.topology import SecondaryGroup
from zerolite.comm.wire_count import WireCounter
from zerolite.errors import ZeroliteStateError


class PendingReduce:
    """An in-flight reduction; `wait()` returns the averaged fp32 gradient shard."""

    def __init__(self, work, result: torch.Tensor, finish=None):
        self._work, self._result, self._finish = work, result, finish

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
        return self._finish(self._result) if self._finish else self._result


SCATTER_METHODS = ("reduce_scatter", "all_to_all", "all_reduce")


def default_scatter_method() -> str:
    """[Note: gloo] On gloo a reduce-scatter is built from all_to_all + a local sum: gloo's own
    reduce_scatter copies its input synchronously in the calling thread, and an all-reduce
    followed by taking a slice moves twice the bytes (ring all-reduce: 2(N-1)/N of the
    buffer; all_to_all: (N-1)/N). all_to_all also takes the least CPU of the three, and CPU is
    what ranks on one host share (benchmarks/gloo_reduce_bench.py measures the three; its
    figures are in benchmarks/results/gloo_reduce*.json and docs/benchmarks.md). NCCL (and any other backend) keeps the real
    reduce-scatter."""
    if dist.is_initialized() and dist.get_backend() == "gloo":
        return "all_to_all"
    return "reduce_scatter"


class GradReducer:
    """Exact reduction: a reduce-scatter (stages 1-3) or all-reduce (stage 0, one partition).

    `comm_dtype` (DeepSpeed's `communication_data_type`) sends 16-bit values; reduce_scatter
    and all_reduce sum in that dtype, all_to_all sums the received chunks in fp32 and rounds
    the sum to it. Without one it sends fp32 (build.py passes the training dtype, DeepSpeed's
    default); a flat's own `comm_dtype` (torch_autocast) wins.
    `predivide` (DeepSpeed's `gradient_predivide_factor` with `prescale_gradients`) divides
    before the sum and the rest after; without it, a 16-bit send from a sharded flat
    (stages 1-3) is divided by the world size before the sum, as DeepSpeed's ZeRO optimizers
    do (so the sum rounds and overflows where DeepSpeed's does), and everything else after
    it (stage 0's all-reduce, as DeepSpeed's engine by default; an fp32 sum gives the same
    numbers either way for a power-of-two world, with one pass over the buffer fewer).
    `scatter_method` is how the reduce-scatter is done (SCATTER_METHODS; default:
    default_scatter_method()).
    """

    def __init__(self, world_size: int, comm_dtype: torch.dtype | None = None,
                 predivide: float = 1.0, scatter_method: str | None = None,
                 wire: WireCounter | None = None):
        self.world_size = world_size
        self.comm_dtype = comm_dtype or torch.float32
        self.predivide = predivide
        method = scatter_method or default_scatter_method()
        if method not in SCATTER_METHODS:
            raise ValueError(f"scatter_method {method!r}: expected one of {SCATTER_METHODS}")
        self.scatter_method = method
        self.wire = wire if wire is not None else WireCounter()
        """Bytes this rank put on the wire by collective kind, and the part to other nodes
        (wire_count.py; cumulative, readers take differences)."""

    @property
    def bytes_sent(self) -> Counter:
        return self.wire.sent

    def _count(self, kind: str, t: torch.Tensor) -> None:
        self.wire.add(kind, kind, t.numel() * t.element_size(), world=self.world_size)

    def start(self, flat, full_grad: torch.Tensor) -> PendingReduce:
        comm_dtype = flat.comm_dtype or self.comm_dtype
        pre = self.predivide
        if pre == 1.0 and flat.partitions > 1 and comm_dtype != torch.float32:
            pre = float(self.world_size)  # DeepSpeed's ZeRO averages before the sum
        send = full_grad if full_grad.dtype == comm_dtype else full_grad.to(comm_dtype)
        if pre != 1.0:
            send.div_(pre)  # in the comm dtype, as DeepSpeed divides
        post = pre / self.world_size

        def finish(result):
            return result.float().mul_(post) if post != 1.0 else result.float()

        def finish_in_place(result):
            # stage 0 in 16 bit: scaled in the dtype it was summed in, as DeepSpeed's engine
            # scales its all-reduced p.grad; the full buffer itself, which the flat keeps
            return result.mul_(post) if post != 1.0 else result

        if flat.partitions == 1:
            self._count("all_reduce", send)
            return PendingReduce(all_reduce_sum(send, async_op=True), send,
                                 finish_in_place if flat.keeps_reduced_grad else finish)
        if self.scatter_method == "all_reduce":
            def finish_slice(result):
                shard = flat.local_shard_of(result).to(torch.float32, copy=True)
                return shard.mul_(post) if post != 1.0 else shard

            self._count("all_reduce", send)
            return PendingReduce(all_reduce_sum(send, async_op=True), send, finish_slice)
        if self.scatter_method == "all_to_all":
            pool = getattr(flat, "pool", None)
            recv = (pool.take(send.numel(), send.dtype, send.device) if pool is not None
                    else torch.empty_like(send))

            def finish_sum(result):
                # Every rank sums its own chunk over ranks in rank order: deterministic. A
                # 16-bit sum is rounded to its dtype, as a 16-bit reduce-scatter leaves it.
                shard = result.view(flat.partitions, flat.shard_numel).sum(0, dtype=torch.float32)
                if pool is not None:
                    pool.give(result)
                if result.dtype != torch.float32:
                    shard = shard.to(result.dtype).float()
                return shard.mul_(post) if post != 1.0 else shard

            self._count("all_to_all", send)
            return PendingReduce(all_to_all_flat(recv, send, async_op=True), recv, finish_sum)
        out = torch.empty(flat.shard_numel, dtype=send.dtype, device=send.device)
        self._count("reduce_scatter", send)
        return PendingReduce(reduce_scatter_flat(out, send, async_op=True), out, finish)


class ParamGatherer:
    """Exact gather of a unit's full parameters from the compute-dtype shards over every
    rank, or, while the flat holds an hpZ secondary shard, from the secondary shards over
    this rank's hpZ group (`secondary`: inside one node; zero/flat_param.py says when a
    flat holds one)."""

    def __init__(self, wire: WireCounter | None = None, secondary: SecondaryGroup | None = None,
                 group=None):
        self.wire = wire if wire is not None else WireCounter()
        self.secondary = secondary
        self.group = group
        """Process group of the gathers over every rank (the device layer's gather
        communicator on NCCL; None = the default group)."""

    @property
    def bytes_sent(self) -> Counter:
        return self.wire.sent

    def start(self, flat, fetch: bool = False):
        """`fetch` (a forward or backward gather): gather in the flat's fetch_dtype, if it
        has one; from an hpZ secondary shard always exactly."""
        if flat.secondary is None:
            return self._start_from_shards(flat, fetch)
        group = self.secondary
        if group is None or group.size != flat.secondary_partitions:
            raise ZeroliteStateError(f"{flat!r} holds an hpZ secondary shard of 1/"
                                     f"{flat.secondary_partitions} but the gatherer's hpZ group "
                                     f"is {group}; this is a zerolite bug, please report it")
        src = flat.secondary
        self.wire.add("secondary_all_gather", "all_gather", src.numel() * src.element_size(),
                      group.ranks)
        return start_full_flat_gather(flat.alloc_full(), src, group.size, group=group.group)

    def _start_from_shards(self, flat, fetch: bool = False):
        dtype = flat.fetch_dtype if fetch else None
        source = flat.gather_source() if dtype is None else flat.gather_source().to(dtype)
        self.wire.add("all_gather", "all_gather", source.numel() * source.element_size(),
                      world=flat.partitions)
        if dtype is None:
            return start_full_flat_gather(flat.alloc_full(), source, flat.partitions,
                                          group=self.group)
        wire_buf = torch.empty(flat.padded_numel, dtype=dtype, device=source.device)
        work = start_full_flat_gather(wire_buf, source, flat.partitions, group=self.group)
        return _CastOnWait(work, wire_buf, flat.alloc_full())


class _CastOnWait:
    """A gather in a narrower dtype; `wait()` copies what arrived into the full buffer."""

    def __init__(self, work, received: torch.Tensor, full: torch.Tensor):
        self._work, self._received, self._full = work, received, full

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self, timeout=None):
        if self._received is not None:
            if self._work is not None:
                self._work.wait()
            self._full.copy_(self._received)
            self._received = None
        return True
