"""Where a flat's bytes live: one typed decision, made before the flat is built and passed to it.

A FlatParam (flat_param.py) holds three tensors: the compute-dtype `shard` this rank owns, the
`full` buffer while gathered, and the fp32 `master` the optimizer updates. Where the shard and
the master live is chosen once, from the config, and never changes afterwards:

  shard   ShardHome.DEVICE   on the engine's device (the default)
          ShardHome.HOST     in host memory, copied to the device right before each gather
          ShardHome.FILE     in a file, in memory only around its gather
  master  MasterHome.NONE    nothing to optimize (frozen, or not in any param group)
          MasterHome.SHARD   fp32 training: the master IS the param shard
          MasterHome.DEVICE  a separate fp32 tensor beside the shard
          MasterHome.HOST    in host memory (its optimizer state and update too)
          MasterHome.FILE    in the chunked optimizer's swap files

[Note: placement is passed in, as FSDP2 passes its OffloadPolicy] The engine resolves a
`PlacementPlan` from the config (zerolite/offload/plan.py) before the model is sharded;
ShardedModel asks it for each flat's FlatPlacement while building the flats, and the flat asks
its placement where to put its tensors in its constructor. Nothing outside the flat assigns
its tensors later, there is no `None` slot to probe for "is this offloaded", and the order in
which the engine builds the optimizer does not change where anything lives. The default plan,
`ON_DEVICE`, is used by everything that does not offload (and by the tests of this package).

The strategies themselves are small objects behind two interfaces: `ShardPlacement` (where
the compute-dtype shard is read for a gather and written after a step) and `MasterPlacement`
(where the fp32 master is read and written, where a reduced gradient shard goes, how a step's
result reaches the shard). Device ones live here; host and file ones in zerolite/offload/.
The `flat` their methods take is the FlatParam being placed (flat_param.py imports this file,
not the other way round).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
import torch
import torch.nn as nn


class ShardHome(enum.Enum):
    DEVICE = "device"
    HOST = "host"
    FILE = "file"


class MasterHome(enum.Enum):
    NONE = "none"
    SHARD = "is the shard"
    DEVICE = "device"
    HOST = "host"
    FILE = "file"


@dataclass(frozen=True)
class FlatSpec:
    """What a plan needs to know about a flat to place it (known before the flat is built)."""

    unit_index: int
    position: int
    """Index of the flat within its unit."""
    shard_numel: int
    optimized: bool
    """Has an fp32 master (requires grad and in an optimizer param group)."""
    compute_dtype: torch.dtype
    device: torch.device
    master_dtype: torch.dtype = torch.float32
    """fp32, or bf16 with bf16.bf16_master_weights_and_grads."""

    @property
    def master_is_shard(self) -> bool:
        """The master has the compute dtype, so on the device it can BE the shard."""
        return self.master_dtype == self.compute_dtype


class ShardPlacement:
    """The compute-dtype shard on the engine's device (the base class is the device case)."""

    home = ShardHome.DEVICE

    def place(self, flat, shard: torch.Tensor) -> torch.Tensor | None:
        """At construction: the tensor the flat keeps as its shard, or None when the shard
        is kept out of memory (`shard` is on the device; with fp32 training it is the master's
        storage)."""
        return shard

    @property
    def full_is_shard_capable(self) -> bool:
        """With one partition, may the full buffer be the shard itself (no copy)?"""
        return True

    def gather_source(self, flat) -> torch.Tensor:
        """The shard as the all-gather reads it, on the device."""
        return flat.shard

    def read(self, flat) -> torch.Tensor:
        """This rank's current shard values (may be a temporary read from elsewhere)."""
        return flat.shard

    def write(self, flat, lo: int, values: torch.Tensor) -> None:
        """Store `values` (any float dtype) into the shard from element `lo`."""
        flat.shard[lo:lo + values.numel()].copy_(values.reshape(-1))



class MasterPlacement:
    """The fp32 master on the engine's device (separate from the shard, or the shard itself)."""

    home = MasterHome.DEVICE

    def place(self, flat, master: nn.Parameter) -> nn.Parameter:
        """At construction: the master the optimizer will see (`master` is on the device)."""
        return master

    def read(self, flat) -> torch.Tensor:
        return flat.master.detach()

    def write(self, flat, value: torch.Tensor) -> None:
        flat.master.data.copy_(value.reshape(-1))

    def take_grad_shard(self, flat, shard: torch.Tensor, name: str) -> None:
        """A reduced fp32 gradient shard for this master (added to a pending one), kept in
        the master's dtype (bf16 with bf16.bf16_master_weights_and_grads, as DeepSpeed) at
        the flat's gradient precision ([Note: gradient precision] in flat_param.py)."""
        master = flat.master
        if shard.dtype != master.dtype:
            shard = shard.to(master.dtype)
        if master.grad is None:
            master.grad = flat.round_grad_(shard)
        else:
            flat.round_grad_(master.grad.add_(flat.round_grad_(shard)))

    def refresh_shard(self, flat) -> None:
        """After the optimizer step: the new master values into the compute-dtype shard."""
        if flat.placement.shard.home is ShardHome.DEVICE \
                and flat.shard.data_ptr() == flat.master.data_ptr():
            return  # fp32: the master is the shard
        flat.write_shard(0, flat.master.detach())

    def resident_nbytes(self, flat) -> int:
        """Device / RAM bytes the master takes beyond the compute-dtype shard."""
        if flat.master.data_ptr() == flat.shard.data_ptr():
            return 0
        return flat.master.numel() * flat.master.element_size()


class MasterIsShard(MasterPlacement):
    """The master has the compute dtype (fp32 training, or bf16 masters with bf16 compute) and
    is on the device: its storage IS the compute-dtype shard."""

    home = MasterHome.SHARD


class NoMaster(MasterPlacement):
    """Nothing to optimize: the flat has no master."""

    home = MasterHome.NONE

    def refresh_shard(self, flat) -> None:
        return

    def resident_nbytes(self, flat) -> int:
        return 0


@dataclass(frozen=True)
class FlatPlacement:
    shard: ShardPlacement
    master: MasterPlacement

    @property
    def master_home(self) -> MasterHome:
        return self.master.home


DEVICE_SHARD = ShardPlacement()
DEVICE_MASTER = MasterPlacement()
MASTER_IS_SHARD = MasterIsShard()
NO_MASTER = NoMaster()


def device_master(spec: FlatSpec) -> MasterPlacement:
    """The master's placement when it stays on the device."""
    if not spec.optimized:
        return NO_MASTER
    return MASTER_IS_SHARD if spec.master_is_shard else DEVICE_MASTER


class PlacementPlan:
    """Chooses each flat's placement; the base plan keeps everything on the device.

    Offload plans (zerolite/offload/plan.py) override `placement_for` and the step hooks."""

    def placement_for(self, spec: FlatSpec) -> FlatPlacement:
        return FlatPlacement(DEVICE_SHARD, device_master(spec))

    def place_all(self, specs: list[FlatSpec]) -> list[FlatPlacement]:
        """Every flat's placement, in model order (called once, before any flat is built)."""
        return [self.placement_for(s) for s in specs]

    def wrap_optimizer(self, optimizer):
        """The optimizer the engine steps, built over the finished masters (offload plans
        may wrap it); the base plan returns it unchanged."""
        return optimizer

    def settle(self) -> None:
        """Block until every host <-> device copy issued so far is done (offload 'cpu')."""

    def before_gather(self, unit) -> None:
        """Right before `unit`'s all-gathers start (offload_param nvme: load its shards)."""

    def after_gather(self, unit) -> None:
        """`unit`'s all-gathers are done."""

    def after_release(self, unit) -> None:
        """`unit`'s full buffers went back to the pool."""

    def after_refresh(self) -> None:
        """Every shard was refreshed from its master (after an optimizer step)."""

    def host_nbytes(self, flats, optimizer) -> dict:
        """Bytes this rank holds in host memory apart from the device, by kind."""
        return {}

    def read_buffer_bytes(self) -> int:
        """Host bytes of shard buffers held apart from the flats (offload_param nvme)."""
        return 0


ON_DEVICE = PlacementPlan()
