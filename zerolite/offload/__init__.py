"""ZeRO-Offload / ZeRO-Infinity for the optimizer: `zero_optimization.offload_optimizer`.

- device "nvme": the optimizer's per-element state goes to files under `nvme_path` and the step
  runs in `sub_group_size`-element chunks (chunked_optimizer.py, swap_files.py). `ratio` < 1
  keeps the last (1 - ratio) of the chunks in memory.
- device "cpu": the fp32 masters, optimizer state and update live in host memory
  (host_placement.py places them before the optimizer is built; host_transfers.py moves
  gradients and updated shards). With the model on the CPU they already do: nothing moves.

With nvme the fp32 masters stay in memory (with fp32 training they are the param shards).
"""
from __future__ import annotations

import logging

import torch

from zerolite.errors import ZeroliteConfigError

logger = logging.getLogger("zerolite")


def wrap_optimizer_for_offload(optimizer: torch.optim.Optimizer | None, zc, rank: int):
    """The optimizer the engine should use given `zc` (a ZeroOptimizationConfig)."""
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

    wrapped = ChunkedOffloadOptimizer(optimizer, nvme_path=block["nvme_path"], rank=rank,
                                      sub_group_size=int(zc.sub_group_size),
                                      ratio=block["ratio"], pin_memory=block["pin_memory"])
    if rank == 0:
        s = wrapped.offload_stats()
        logger.info("zerolite: optimizer state offloaded to %s (%d of %d chunks of <= %d "
                    "elements on disk)", block["nvme_path"], s["chunks_on_disk"], s["chunks"],
                    int(zc.sub_group_size))
    return wrapped
