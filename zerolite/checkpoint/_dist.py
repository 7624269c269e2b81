"""The few collectives checkpointing needs, safe at world size 1 or without a process group."""
from __future__ import annotations

import torch.distributed as dist


def all_gather_object(obj) -> list:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree(error: str | None, what: str = "checkpoint") -> list:
    """Collective: every rank learns every rank's error (or None). Call on all ranks."""
    return all_gather_object(error)


def first_error(errors: list) -> tuple[int, str] | None:
    for r, e in enumerate(errors):
        if e is not None:
            return r, e
    return None
