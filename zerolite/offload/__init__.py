"""ZeRO-Offload / ZeRO-Infinity for the optimizer: `zero_optimization.offload_optimizer`.

- device "nvme": the optimizer's per-element state goes to files under `nvme_path` and the step
  runs in `sub_group_size`-element chunks (chunked_optimizer.py, swap_files.py). `ratio` < 1
  keeps the last (1 - ratio) of the chunks in memory.
- device "cpu": the fp32 masters, optimizer state and update live in host memory
  (host_placement.py places them before the optimizer is built; host_transfers.py moves
  gradients and updated shards). With the model on the CPU they already do: nothing moves.

With "nvme" and 16-bit training the fp32 masters go to the files with the state (ZeRO-Infinity;
see chunked_optimizer.py, "swapped masters"); with fp32 training the master IS the param shard
and stays in memory unless offload_param puts the shard on disk as well.
"""
from __future__ import annotations

import logging

import torch

from zerolite.errors import ZeroliteConfigError

logger = logging.getLogger("zerolite")


def _shard_sink(flat):
    def sink(lo: int, values: torch.Tensor) -> None:
        flat.write_shard(lo, values)
    return sink


def _param_nvme(zc) -> bool:
    return bool(zc.offload_param) and zc.offload_param["device"] == "nvme"


def wrap_optimizer_for_offload(optimizer: torch.optim.Optimizer | None, zc, rank: int,
                               flats=None):
    """The optimizer the engine should use given `zc` (a ZeroOptimizationConfig); `flats`
    (the sharded model's FlatParams) lets 16-bit masters be swapped out with the state."""
    block = zc.offload_optimizer
    if block is None or optimizer is None:
        return optimizer
    if block["device"] == "cpu":
        # Note: the step is not chunked by sub_group_size here: the host step is one torch
        # optimizer step over the host masters (its state is in RAM, nothing to stream).
        return optimizer  # the masters were placed in host memory (place_on_host)
    if int(zc.sub_group_size) < 1:
        raise ZeroliteConfigError(f"zero_optimization.sub_group_size: got {zc.sub_group_size}; "
                                  "the NVMe offload steps in chunks of this many elements, "
                                  "so it must be >= 1")
    from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer

    # 16-bit training: the fp32 master is separate from the param shard, so it can leave RAM;
    # fp32 with offload_param nvme: the master IS the shard, and both leave RAM (param_swap.py).
    swap = {f.master: f for f in flats or [] if f.master is not None
            and (f.master.data_ptr() != f.shard.data_ptr() or _param_nvme(zc))}
    wrapped = ChunkedOffloadOptimizer(optimizer, nvme_path=block["nvme_path"], rank=rank,
                                      sub_group_size=int(zc.sub_group_size),
                                      ratio=block["ratio"], pin_memory=block["pin_memory"],
                                      master_sinks={m: _shard_sink(f) for m, f in swap.items()})
    for f in swap.values():
        f.master_store = wrapped
    if rank == 0:
        s = wrapped.offload_stats()
        logger.info("zerolite: optimizer state%s offloaded to %s (%d of %d chunks of <= %d "
                    "elements on disk)", " and fp32 masters" if swap else "",
                    block["nvme_path"], s["chunks_on_disk"], s["chunks"],
                    int(zc.sub_group_size))
    return wrapped


def attach_param_offload(sharded, zc, rank: int, optimizer, compute_dtype: torch.dtype):
    """`zero_optimization.offload_param`: returns the ParamSwap now holding the param shards
    (device "nvme"), or None."""
    block = zc.offload_param
    if block is None:
        return None
    if block["device"] == "cpu":
        return None  # placed in host memory before the optimizer was built (host_placement)
    masters_swapped = any(f.master_store is not None for f in sharded.flats)
    if compute_dtype == torch.float32 and not masters_swapped and \
            any(f.master is not None for f in sharded.flats):
        raise ZeroliteConfigError(
            "zero_optimization.offload_param.device: 'nvme' with fp32 training needs "
            "zero_optimization.offload_optimizer.device 'nvme' too: the fp32 param shard IS the "
            "optimizer's master, which an in-memory optimizer keeps in RAM; add an "
            "offload_optimizer block with device 'nvme' (or train in bf16/fp16)")
    from zerolite.offload.param_swap import ParamSwap

    reader = optimizer.read_master if masters_swapped else None
    swap = ParamSwap(sharded.units, nvme_path=block["nvme_path"], rank=rank,
                     read_ahead=int(block["buffer_count"]), master_reader=reader)
    sharded.param_swap = swap
    if rank == 0:
        s = swap.offload_stats()
        logger.info("zerolite: param shards offloaded to %s (%d flats, %d of them read from the "
                    "optimizer's fp32 master files); offload_param.buffer_count=%d shards read "
                    "ahead; offload_param.buffer_size and max_in_cpu are ignored (each shard is "
                    "read whole into its own buffer and dropped after its gather)",
                    block["nvme_path"], len(sharded.flats), s["shards_from_master_files"],
                    int(block["buffer_count"]))
    return swap
