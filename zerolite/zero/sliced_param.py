"""Per-parameter slices for `zero.Init`: split, gather and release ONE parameter.

A partitioned parameter carries `p.zl_partitioned` (PartitionInfo) and DeepSpeed's
`p.ds_shape`, `p.ds_numel`, `p.ds_id`, `p.ds_status`, `p.ds_param_type` (param_status.py) and
`p.ds_tensor`
(the local slice): this rank's contiguous slice of the flattened value, `ceil(numel / world)`
elements, zero padded on the last rank (the split of shard_math.py).

[Note: 0-element data, as DeepSpeed] Outside GatheredParameters a partitioned parameter's
`.data` is an empty tensor (`p.numel() == 0`, `p.shape == (0,)`), exactly as under DeepSpeed:
code written for DeepSpeed decides "must I gather this?" by `p.numel() == 0` or `ds_status`,
and reads sizes from `p.ds_shape` / `p.ds_numel`. The slice lives in `ds_tensor`. Everything in
zerolite that lays out parameters (FlatParam slots) asks `full_shape(p)`, never `p.shape`.
A stray read outside the context fails loudly (a shape mismatch), it cannot compute with
stale values.

`copy_full_value` is what FlatParam calls to read a parameter's value when the engine is
built: a plain copy for ordinary parameters, an all-gather of the slices for partitioned ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from zerolite.comm.collectives import gather_full_flat
from zerolite.errors import ZeroliteConfigError
from zerolite.zero.param_status import ZeroParamStatus, ZeroParamType
from zerolite.zero.shard_math import rank_range, shard_numel


@dataclass
class PartitionInfo:
    """How a zero.Init-partitioned parameter is split; set as `param.zl_partitioned`."""

    shape: torch.Size
    numel: int
    rank: int
    world: int
    local: torch.Tensor = field(repr=False, default=None)
    """This rank's slice of the flattened value: `shard_numel` elements (padded)."""
    gathered: int = 0
    """Nesting depth of GatheredParameters contexts holding the full value right now."""

    @property
    def shard_numel(self) -> int:
        return shard_numel(self.numel, self.world)

    def keep_local_part(self, full: torch.Tensor) -> None:
        """Store this rank's part of the full value `full` in the local slice."""
        lo, hi = rank_range(self.rank, self.shard_numel, limit=self.numel)
        self.local[:hi - lo].copy_(full.reshape(-1)[lo:hi])


def partition_info(p) -> PartitionInfo | None:
    """The zero.Init slice of `p`, or None (device/placement.py's `slice_of`)."""
    return getattr(p, "zl_partitioned", None)


def is_partitioned(p) -> bool:
    return getattr(p, "zl_partitioned", None) is not None


# -- collectives on whatever device the backend needs ---------------------------------------
def _comm_device(t: torch.Tensor) -> torch.device:
    if t.device.type == "cpu" and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def broadcast_(t: torch.Tensor, src: int) -> None:
    """In-place broadcast of contiguous `t` from global rank `src` (moved to the backend's
    device if needed, e.g. a CPU-built parameter under NCCL)."""
    if dist.get_world_size() == 1:
        return
    dev = _comm_device(t)
    buf = t if dev == t.device else t.to(dev)
    dist.broadcast(buf, src=src)
    if buf is not t:
        t.copy_(buf)


def _all_gather_slices(local: torch.Tensor, world: int) -> torch.Tensor:
    """Concatenate every rank's `local` slice (rank order) into a new 1-D tensor."""
    dev = _comm_device(local)
    out = gather_full_flat(local.to(dev), world)
    return out if dev == local.device else out.to(local.device)


def released_data(like: torch.Tensor) -> torch.Tensor:
    """What a partitioned parameter's `.data` is outside GatheredParameters: 0 elements, of
    the parameter's dtype, on the slice's device."""
    return torch.empty(0, dtype=like.dtype, device=like.device)


def full_shape(p: torch.Tensor) -> torch.Size:
    """The shape `p` has when gathered (its `.shape` is `(0,)` while partitioned)."""
    info = getattr(p, "zl_partitioned", None)
    return p.shape if info is None else info.shape


# -- partition / gather / release of one parameter ------------------------------------------
@torch.no_grad()
def partition_param(p: nn.Parameter, dtype: torch.dtype | None = None,
                    ds_id: int | None = None, device: torch.device | None = None) -> int:
    """Broadcast `p` from rank 0, keep this rank's slice on `device` (default: where `p`
    is); returns the slice's bytes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = p.device if device is None else torch.device(device)
    full = p.detach().to(device).contiguous()
    broadcast_(full, src=0)
    info = PartitionInfo(torch.Size(p.shape), p.numel(), rank, world)
    info.local = torch.zeros(info.shard_numel, dtype=dtype or p.dtype, device=device)
    info.keep_local_part(full)
    local = info.local
    p.data = released_data(local)
    p.zl_partitioned = info
    p.ds_shape, p.ds_numel, p.ds_tensor = info.shape, info.numel, local
    p.ds_status = ZeroParamStatus.NOT_AVAILABLE
    p.ds_param_type = ZeroParamType.PARTITIONED
    p.ds_persist = False  # DeepSpeed's zero.Init too; the engine decides (partition.py)
    if not hasattr(p, "ds_id"):
        p.ds_id = ds_id
    return local.numel() * local.element_size()


@torch.no_grad()
def gather_partitioned(p: nn.Parameter) -> None:
    """Give a partitioned `p` its full value (collective). Nested calls only count."""
    info = p.zl_partitioned
    info.gathered += 1
    if info.gathered == 1:
        full = _all_gather_slices(info.local, info.world)[:info.numel]
        p.data = full.view(info.shape)
        p.ds_status = ZeroParamStatus.AVAILABLE


@torch.no_grad()
def release_partitioned(p: nn.Parameter, modifier_rank: int | None) -> None:
    """Undo one gather_partitioned; with `modifier_rank`, first broadcast the value from that
    rank and store it in the local slice (collective)."""
    info = p.zl_partitioned
    if modifier_rank is not None:
        value = p.detach()
        if tuple(value.shape) != tuple(info.shape):
            raise ZeroliteConfigError(
                f"GatheredParameters: a parameter of shape {tuple(info.shape)} was given a "
                f"value of shape {tuple(value.shape)}; modify it in place instead")
        value = value.contiguous()
        broadcast_(value, src=modifier_rank)
        info.keep_local_part(value)
    info.gathered -= 1
    if info.gathered == 0:
        p.data = released_data(info.local)
        p.ds_status = ZeroParamStatus.NOT_AVAILABLE


def copy_full_value(p: torch.Tensor, dest: torch.Tensor) -> None:
    """Copy `p`'s full value, flattened, into `dest` (FlatParam construction).

    Ordinary parameters: a plain copy. zero.Init-partitioned ones: all-gather of the slices
    (collective — every rank builds its FlatParams in the same order, so the calls match),
    after which the slice is dropped: from here on the engine owns the value.
    """
    info = getattr(p, "zl_partitioned", None)
    if info is None or info.gathered:
        dest.copy_(p.detach().reshape(-1))
        return
    with torch.no_grad():
        dest.copy_(_all_gather_slices(info.local, info.world)[:info.numel])
    p.zl_partitioned = None
    p.ds_tensor = None
