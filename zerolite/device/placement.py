"""Moving a user's module onto the engine's device, as `deepspeed.initialize` does.

[Note: not `module.to(device)`] Under `zero.Init` a parameter's `.data` has 0 elements and
its values live in a slice of this rank (the caller's `slice_of(p)`: zero/sliced_param.py's
`partition_info`; this layer does not know zero/'s attributes); `module.to()` would move the
empty tensor and leave the slice behind. We move the slice (and the empty `.data` with it),
and keep the user's Parameter objects (only `.data` changes).
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn as nn


class ParamSlice(Protocol):
    """What moving a zero.Init parameter needs to know (zero/sliced_param.PartitionInfo)."""

    shape: torch.Size
    local: torch.Tensor
    gathered: int


def no_slices(p: nn.Parameter) -> ParamSlice | None:
    return None


def place_module(module: nn.Module, device: torch.device | str,
                 slice_of: Callable[[nn.Parameter], ParamSlice | None] = no_slices) -> nn.Module:
    """Move every parameter, gradient and buffer of `module` to `device` (in place)."""
    device = torch.device(device)
    return move_module(module, lambda t: t.to(device), slice_of)


@torch.no_grad()
def move_module(module: nn.Module, move,
                slice_of: Callable[[nn.Parameter], ParamSlice | None] = no_slices) -> nn.Module:
    """Apply `move` (tensor -> tensor, returning its input when nothing changes) to every
    parameter value, zero.Init slice (`slice_of(p)`), gradient and buffer of `module`."""
    for sub in module.modules():
        for p in sub.parameters(recurse=False):
            info = slice_of(p)
            if info is None:
                moved = move(p.data)
                if moved is not p.data:
                    p.data = moved
            else:
                local = move(info.local)
                if local is not info.local:
                    info.local = p.ds_tensor = local
                    p.data = move(p.data)  # the full value inside GatheredParameters, else empty
            if p.grad is not None:
                grad = move(p.grad)
                if grad is not p.grad:
                    p.grad = grad
        for key, buf in sub._buffers.items():
            if buf is not None:
                sub._buffers[key] = move(buf)
    return module
