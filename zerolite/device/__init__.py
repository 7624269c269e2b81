"""Where zerolite's tensors live and how its side streams are ordered (see layer.py).

`default_device()` is DeepSpeed's choice: `cuda:LOCAL_RANK` when CUDA is usable, else CPU.
`DeviceLayer(device)` gives the engine an all-gather stream, a reduce stream, timers and
memory figures; on CPU every stream operation is a no-op, so one code path serves both.
"""
from __future__ import annotations

import os

import torch

from zerolite.device.backends import CudaBackend, HostBackend, backend_for
from zerolite.device.layer import DeviceLayer, SideStream, Ticket, Timer
from zerolite.device.placement import place_module

__all__ = ["default_device", "DeviceLayer", "SideStream", "Ticket", "Timer", "HostBackend",
           "CudaBackend", "backend_for", "make_device_layer", "place_module"]


def default_device() -> torch.device:
    """cuda:LOCAL_RANK (modulo the visible devices) when CUDA is available, else cpu."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def make_device_layer(device: torch.device | str) -> DeviceLayer:
    """The engine's layer. On NCCL, gathers get a communicator of their own.

    [Note: two communicators] NCCL runs the collectives of one communicator in issue order
    on one internal stream, so a backward prefetch issued after a reduce-scatter would wait
    behind it; a second group for gathers lets both run at once. Gloo needs none (each
    async op runs on its own thread) and CPU never creates one. Collective: every rank
    must build its layer at the same point (engine construction).
    """
    import torch.distributed as dist

    layer = DeviceLayer(device)
    if layer.gather.eager and dist.is_initialized() and dist.get_world_size() > 1:
        layer.gather.group = dist.new_group(ranks=list(range(dist.get_world_size())))
    return layer
