"""The offload plan: `zero_optimization.offload_optimizer` / `offload_param` resolved once, before
the model is sharded, into one placement per flat (zerolite/zero/flat_placement.py).

  offload_optimizer cpu   HostMaster for optimized flats in model order while fewer than
                          `ratio` x all optimized elements are placed (host_placement.py)
  offload_param cpu       HostShard for every flat (needs offload_optimizer cpu, ratio 1)
  offload_param nvme      FileShard for every flat: one ParamFiles (param_swap.py)
  offload_optimizer nvme  the optimizer is stepped chunk by chunk from swap files
                          (chunked_optimizer.py); with 16-bit training, or with offload_param
                          nvme too, the masters go to those files: FileMaster

The engine builds the plan, the ShardedModel over it (each FlatParam gets its placement in
its constructor), then the optimizer over the finished masters (`plan.wrap_optimizer`): one
pass, nothing re-placed afterwards.

[Note: swapped masters are joined to their store once] A FileMaster's values move into the
chunked optimizer's files when that optimizer is built (it needs the torch optimizer, which
needs the masters). Until then (and without any optimizer) they are plain in-memory tensors;
the flat's placement is FILE from the start and never changes. `SwappedMasters` is the one
object the FileMaster placements and the chunked optimizer share.
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn

from zerolite.config.offload import OffloadConfig
from zerolite.errors import ZeroliteConfigError
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer
from zerolite.offload.host_placement import HostMaster, HostShard
from zerolite.offload.host_transfers import HostTransfers
from zerolite.offload.param_swap import ParamFiles
from zerolite.zero.flat_placement import (DEVICE_SHARD, NO_MASTER, FlatPlacement, FlatSpec,
                                          MasterHome, MasterPlacement, PlacementPlan,
                                          device_master)

logger = logging.getLogger("zerolite")


class SwappedMasters:
    """The fp32 masters that live in the chunked optimizer's files (FileMaster placements)."""

    def __init__(self):
        self.flats: dict[nn.Parameter, object] = {}
        """master -> its FlatParam, in placement order."""
        self.store: ChunkedOffloadOptimizer | None = None
        """The chunked optimizer holding them (set by OffloadPlan.wrap_optimizer)."""

    def read(self, master, out: torch.Tensor | None = None) -> torch.Tensor:
        """The committed fp32 values of `master` (into `out`, a host buffer, if given)."""
        if self.store is None:  # a copy: callers may recycle what they get (param_swap.py)
            return master.detach().clone() if out is None else out.copy_(master.detach())
        return self.store.read_master(master, out)


class FileMaster(MasterPlacement):
    """A flat's fp32 master in the chunked optimizer's swap files (ZeRO-Infinity)."""

    home = MasterHome.FILE

    def __init__(self, masters: SwappedMasters):
        self.masters = masters

    def place(self, flat, master: nn.Parameter) -> nn.Parameter:
        self.masters.flats[master] = flat
        return master

    def read(self, flat) -> torch.Tensor:
        return self.masters.read(flat.master)

    def write(self, flat, value: torch.Tensor) -> None:
        if self.masters.store is None:
            super().write(flat, value)
        else:  # also writes the compute-dtype shard (the optimizer's sink)
            self.masters.store.write_master(flat.master, value)

    def refresh_shard(self, flat) -> None:
        if self.masters.store is None:
            super().refresh_shard(flat)
        # else the optimizer's step wrote the shard chunk by chunk (its sink)

    def resident_nbytes(self, flat) -> int:
        return 0 if self.masters.store is not None else super().resident_nbytes(flat)


def check_offload(oc: OffloadConfig, stage: int, quantized_weights: bool) -> None:
    """The pairings zerolite refuses, named by their JSON paths."""
    opt, param = oc.optimizer, oc.param
    if param is not None and param.device == "cpu":
        if stage != 3:
            raise ZeroliteConfigError(
                f"zero_optimization.offload_param.device: 'cpu' needs zero_optimization.stage 3 "
                f"(only stage 3 partitions parameters), got stage {stage}")
        if opt is None or opt.device != "cpu" or opt.ratio < 1.0:
            raise ZeroliteConfigError(
                "zero_optimization.offload_param.device: 'cpu' needs "
                "zero_optimization.offload_optimizer.device 'cpu' with ratio 1 (the host shard "
                "is refreshed from a host master); got offload_optimizer "
                f"{opt and {'device': opt.device, 'ratio': opt.ratio}}")
        if quantized_weights:
            raise ZeroliteConfigError(
                "zero_optimization.offload_param.device: 'cpu' together with "
                "zero_quantized_weights is not supported; turn one of them off")


class OffloadPlan(PlacementPlan):
    """Places flats per the offload config; owns the transfers and files they share."""

    def __init__(self, oc: OffloadConfig, *, layer, rank: int, compute_dtype: torch.dtype,
                 separate_host: bool = False):
        self.config, self.rank, self.compute_dtype = oc, rank, compute_dtype
        opt, param = oc.optimizer, oc.param
        cpu_opt = opt is not None and opt.device == "cpu"
        cpu_param = param is not None and param.device == "cpu"
        self.nvme_opt = opt is not None and opt.device == "nvme"
        self.nvme_param = param is not None and param.device == "nvme"
        host_is_device = layer.device.type == "cpu" and not separate_host
        if (cpu_opt or cpu_param) and host_is_device and rank == 0:
            logger.info("zerolite: offload %s 'cpu': the model is on the CPU, so the masters, "
                        "optimizer state and param shards already live in host memory; "
                        "nothing is copied", "optimizer/param" if cpu_param else "optimizer")
        self.host_masters = cpu_opt and not host_is_device
        self.host_shards = cpu_param and not host_is_device
        if (self.host_masters or self.host_shards) and self.nvme_param:
            # The nvme param files are refreshed from an in-RAM or swapped master, not from a
            # host master behind copies to a device: that pairing is not built.
            raise ZeroliteConfigError(
                "zero_optimization.offload_param.device 'nvme' together with "
                "offload_optimizer.device 'cpu' on an accelerator is not implemented; use "
                "offload_optimizer 'nvme' with offload_param 'nvme', or 'cpu' for both")
        self.pin = bool(opt and opt.pin_memory) or bool(param and param.pin_memory)
        self.transfers = HostTransfers(layer.backend) \
            if self.host_masters or self.host_shards else None
        self.param_files = ParamFiles(nvme_path=param.nvme_path, rank=rank,
                                      read_ahead=param.buffer_count) if self.nvme_param else None
        self.swapped = SwappedMasters() if self.nvme_opt else None
        self.placements: list[tuple[FlatSpec, FlatPlacement]] = []

    # -- construction: one placement per flat, in model order ---------------------------------
    def place_all(self, specs: list[FlatSpec]) -> list[FlatPlacement]:
        optimized = [s for s in specs if s.optimized]
        budget = (self.config.optimizer.ratio * sum(s.shard_numel for s in optimized)
                  if self.host_masters else 0)
        placed, out = 0, []
        for spec in specs:
            on_host = self.host_masters and spec.optimized and placed < budget
            if on_host:
                placed += spec.shard_numel
            out.append(self._placement(spec, on_host))
        self.placements = list(zip(specs, out))
        self._log(placed, optimized)
        return out

    def _placement(self, spec: FlatSpec, master_on_host: bool) -> FlatPlacement:
        is_shard = spec.master_is_shard  # fp32 training, or bf16 masters of bf16 compute
        if not spec.optimized:
            master = NO_MASTER
        elif master_on_host:
            master = HostMaster(self.transfers, self.pin, shard_on_host=self.host_shards)
        elif self.swapped is not None and (not is_shard or self.nvme_param):
            # 16-bit: the fp32 master is separate from the param shard, so it can leave RAM;
            # a master that IS the shard (fp32, bf16 masters) leaves RAM with offload_param nvme.
            master = FileMaster(self.swapped)
        elif is_shard and self.nvme_param:
            raise ZeroliteConfigError(
                "zero_optimization.offload_param.device: 'nvme' with masters in the compute "
                "dtype (fp32 training, or bf16.bf16_master_weights_and_grads) needs "
                "zero_optimization.offload_optimizer.device 'nvme' too: the param shard IS "
                "the optimizer's master, which an in-memory optimizer keeps in RAM; add an "
                "offload_optimizer block with device 'nvme'")
        else:
            master = device_master(spec)
        if self.host_shards:
            shard = HostShard(self.transfers, self.pin)
        elif self.param_files is not None:
            from_master = self.swapped if master.home is MasterHome.FILE and is_shard else None
            shard = self.param_files.placement(f"unit{spec.unit_index}.flat{spec.position}",
                                               from_master)
        else:
            shard = DEVICE_SHARD
        return FlatPlacement(shard, master)

    def _log(self, placed: int, optimized: list[FlatSpec]) -> None:
        if self.rank != 0:
            return
        if self.transfers is not None:
            n_host = sum(p.master.home is MasterHome.HOST for _, p in self.placements)
            logger.info("zerolite: offload_optimizer 'cpu': %d of %d optimized flats (%d of %d "
                        "elements) keep their fp32 master and optimizer state in host memory%s%s",
                        n_host, len(optimized), placed, sum(s.shard_numel for s in optimized),
                        " (pinned)" if self.pin else "",
                        "; param shards in host memory too (offload_param 'cpu')"
                        if self.host_shards else "")
        if self.param_files is not None:
            param = self.config.param
            logger.info("zerolite: param shards offloaded to %s (%d flats, %d of them read from "
                        "the optimizer's fp32 master files); offload_param.buffer_count=%d "
                        "shards read ahead; offload_param.buffer_size and max_in_cpu are ignored "
                        "(each shard is read whole into its own buffer and dropped after its "
                        "gather)", param.nvme_path, len(self.placements),
                        sum(p.shard.from_master is not None for _, p in self.placements),
                        param.buffer_count)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer | None):
        """The optimizer the engine steps: `optimizer` itself, or (offload_optimizer nvme) a
        ChunkedOffloadOptimizer over it that takes the FileMaster masters into its files."""
        opt = self.config.optimizer
        if optimizer is None or not self.nvme_opt:
            # Note: with 'cpu' the step is not chunked by sub_group_size: the host step is one
            # torch optimizer step over the host masters (its state is in RAM).
            return optimizer
        if self.config.sub_group_size < 1:
            raise ZeroliteConfigError(
                f"zero_optimization.sub_group_size: got {self.config.sub_group_size}; the NVMe "
                "offload steps in chunks of this many elements, so it must be >= 1")
        sinks = {m: (lambda lo, values, f=f: f.write_shard(lo, values))
                 for m, f in self.swapped.flats.items()}
        wrapped = ChunkedOffloadOptimizer(optimizer, nvme_path=opt.nvme_path, rank=self.rank,
                                          sub_group_size=self.config.sub_group_size,
                                          ratio=opt.ratio, pin_memory=opt.pin_memory,
                                          master_sinks=sinks)
        self.swapped.store = wrapped
        if self.rank == 0:
            s = wrapped.offload_stats()
            logger.info("zerolite: optimizer state%s offloaded to %s (%d of %d chunks of <= %d "
                        "elements on disk)", " and fp32 masters" if sinks else "",
                        opt.nvme_path, s["chunks_on_disk"], s["chunks"],
                        self.config.sub_group_size)
        return wrapped

    # -- the step ----------------------------------------------------------------------------
    def settle(self) -> None:
        if self.transfers is not None:
            self.transfers.settle()

    def before_gather(self, unit) -> None:
        if self.param_files is not None:
            self.param_files.fetch(unit)

    def after_gather(self, unit) -> None:
        if self.param_files is not None:
            self.param_files.after_gather(unit)

    def after_release(self, unit) -> None:
        if self.param_files is not None:
            self.param_files.after_release(unit)

    def after_refresh(self) -> None:
        if self.param_files is not None:  # every new shard is written: read ahead from here
            self.param_files.new_sequence()

    # -- accounting --------------------------------------------------------------------------
    def host_nbytes(self, flats, optimizer) -> dict:
        if self.transfers is None:
            return {}
        out = {"masters": 0, "optimizer_state": 0, "grads": 0, "staging": 0,
               "param_shards": 0}
        for flat in flats:
            where = flat.placement
            if isinstance(where.master, HostMaster):
                for k, v in where.master.host_nbytes(flat, optimizer).items():
                    out[k] += v
            if isinstance(where.shard, HostShard):
                out["param_shards"] += where.shard.host_nbytes(flat)
        out["total"] = sum(out.values())
        return out

    def read_buffer_bytes(self) -> int:
        return self.param_files.read_buffer_bytes() if self.param_files is not None else 0


def build_plan(oc: OffloadConfig, *, stage: int, quantized_weights: bool, layer, rank: int,
               compute_dtype: torch.dtype, separate_host: bool = False) -> PlacementPlan:
    """The plan for this config: the base plan (everything on the device) when nothing is
    offloaded."""
    check_offload(oc, stage, quantized_weights)
    if oc.optimizer is None and oc.param is None:
        return PlacementPlan()
    return OffloadPlan(oc, layer=layer, rank=rank, compute_dtype=compute_dtype,
                       separate_host=separate_host)

