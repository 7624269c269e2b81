"""`deepspeed.comm` (`from deepspeed import comm as dist`): a thin layer over
torch.distributed. DeepSpeed's names that torch lacks are defined here; every other name
(all_reduce, broadcast, barrier, ReduceOp, new_group, ...) is torch.distributed's own."""
from __future__ import annotations

import os

import torch.distributed as _dist

# Same signature as DeepSpeed's (dist_backend, auto_mpi_discovery, timeout, rank, ...).
from zerolite.comm.process_group import init_distributed  # noqa: E402,F401


def is_initialized() -> bool:
    return _dist.is_available() and _dist.is_initialized()


def get_rank(group=None) -> int:
    return _dist.get_rank(group) if is_initialized() else 0


def get_world_size(group=None) -> int:
    return _dist.get_world_size(group) if is_initialized() else 1


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def get_world_group():
    return _dist.group.WORLD


def get_global_rank(group=None, group_rank=0) -> int:
    return _dist.get_global_rank(group, group_rank) if group is not None else group_rank


def reduce_scatter_fn(output_tensor, tensor, op=None, group=None, async_op=False, **_kwargs):
    """DeepSpeed's flat reduce-scatter: `tensor` (world x chunk) -> this rank's `output_tensor`."""
    fn = getattr(_dist, "reduce_scatter_single", None) or _dist.reduce_scatter_tensor
    return fn(output_tensor, tensor, op=op or _dist.ReduceOp.SUM, group=group, async_op=async_op)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False, **_kwargs):
    fn = getattr(_dist, "all_gather_single", None) or _dist.all_gather_into_tensor
    return fn(output_tensor, input_tensor, group=group,
                                        async_op=async_op)


def log_summary(show_straggler: bool = False) -> None:
    """DeepSpeed's comms logger summary; zerolite logs its comm breakdown per step instead
    (`wall_clock_breakdown`), so there is nothing to print here."""


def has_all_gather_into_tensor() -> bool:
    return True  # torch >= 2.3: all of these exist


def has_reduce_scatter_tensor() -> bool:
    return True


def has_all_reduce_coalesced() -> bool:
    return True


def has_coalescing_manager() -> bool:
    return True


def get_all_ranks_from_group(group=None) -> list[int]:
    """Global ranks of `group` (None: the world)."""
    if group is None:
        return list(range(_dist.get_world_size()))
    return list(_dist.get_process_group_ranks(group))


def configure(*_args, **_kwargs) -> None:
    """DeepSpeed's comms-logger configuration: accepted, nothing to configure."""


def __getattr__(name):
    return getattr(_dist, name)

from zerolite.compat.deepspeed._refused_names import refused_stubs  # noqa: E402

globals().update(refused_stubs("deepspeed.comm"))
