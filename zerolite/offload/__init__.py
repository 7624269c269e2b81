"""ZeRO-Offload / ZeRO-Infinity for the optimizer: `zero_optimization.offload_optimizer`.

- device "nvme": the optimizer's per-element state goes to files under `nvme_path` and the step
  runs in `sub_group_size`-element chunks (chunked_optimizer.py, swap_files.py). `ratio` < 1
  keeps the last (1 - ratio) of the chunks in memory.
- device "cpu": with the model on the CPU the masters and state already live in host memory,
  so this is the ordinary in-memory path. On an accelerator it is refused for now.

The fp32 masters stay in memory in both cases (with fp32 training they are the param shards).
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
    masters = [p for g in optimizer.param_groups for p in g["params"]]
    on_cpu = all(p.device.type == "cpu" for p in masters)
    if block["device"] == "cpu":
        if not on_cpu:
            raise ZeroliteConfigError(
                "zero_optimization.offload_optimizer.device: 'cpu' with the model on an "
                "accelerator is not implemented yet (masters and state would stay on the "
                "device); use 'nvme' (state in files, streamed through host memory) or 'none'")
        if rank == 0:
            logger.info("zerolite: offload_optimizer.device='cpu': the model is on the CPU, so "
                        "the fp32 masters and optimizer state already live in host memory")
        return optimizer
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
