"""ZeRO-Offload / ZeRO-Infinity for the optimizer: `zero_optimization.offload_optimizer`.

- device "nvme": the optimizer's per-element state goes to files under `nvme_path` and the step
  runs in `sub_group_size`-element chunks (chunked_optimizer.py, swap_files.py). `ratio` < 1
  keeps the last (1 - ratio) of the chunks in memory.
- device "cpu": with the model on the CPU the masters and state already live in host memory,
  so this is the ordinary in-memory path. On an accelerator it is refused for now.

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
        flat.shard[lo:lo + values.numel()].copy_(values)
    return sink


def wrap_optimizer_for_offload(optimizer: torch.optim.Optimizer | None, zc, rank: int,
                               flats=None):
    """The optimizer the engine should use given `zc` (a ZeroOptimizationConfig); `flats`
    (the sharded model's FlatParams) lets 16-bit masters be swapped out with the state."""
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

    # 16-bit training: the fp32 master is separate from the param shard, so it can leave RAM.
    swap = {f.master: f for f in flats or [] if f.master is not None
            and f.master.data_ptr() != f.shard.data_ptr()}
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
