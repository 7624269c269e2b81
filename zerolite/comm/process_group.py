"""Process-group setup: `init_distributed`, as DeepSpeed's, on top of torch.distributed."""
from __future__ import annotations

import datetime
import logging
import os
import socket

import torch
import torch.distributed as dist

from zerolite.errors import ZeroliteError

logger = logging.getLogger("zerolite")

DEFAULT_TIMEOUT_S = 300.0


def _timeout_from_env(default: float) -> float:
    raw = os.environ.get("ZEROLITE_TIMEOUT")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ZeroliteError(f"ZEROLITE_TIMEOUT={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ZeroliteError(f"ZEROLITE_TIMEOUT={raw!r} must be > 0 seconds")
    return value


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    """NCCL for CUDA tensors where CUDA is usable, gloo otherwise (the CPU test platform).

    With CUDA it is "cpu:gloo,cuda:nccl": the engine's collectives run on NCCL, and the CPU
    tensors of checkpoint, telemetry and user code keep working on gloo (as with DeepSpeed
    on CPU-side objects)."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True,
                     distributed_port: int = 29500, verbose: bool = True,
                     timeout: datetime.timedelta | float | None = None,
                     init_method: str | None = None, dist_init_required: bool | None = None,
                     config=None, rank: int = -1, world_size: int = -1) -> None:
    """Join (or create) the default process group.

    Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
    Without it, starts a single-process group on 127.0.0.1 so scripts also run with plain
    `python`. Every collective then fails after `timeout` (default 300 s, or
    ZEROLITE_TIMEOUT) instead of hanging.
    """
    del auto_mpi_discovery, config  # accepted for DeepSpeed signature compatibility
    if dist.is_initialized():
        _destroy_group_at_exit()
        return
    if dist_init_required is False:
        return
    if timeout is None:
        timeout = _timeout_from_env(DEFAULT_TIMEOUT_S)
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    env_rank = os.environ.get("RANK")
    env_world = os.environ.get("WORLD_SIZE")
    if rank < 0:
        rank = int(env_rank) if env_rank is not None else 0
    if world_size < 0:
        world_size = int(env_world) if env_world is not None else 1
    if init_method is None:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            if world_size > 1:
                os.environ["MASTER_PORT"] = str(distributed_port)
            else:
                os.environ["MASTER_PORT"] = str(free_port())
        init_method = "env://"
    backend = dist_backend or default_backend()
    if "nccl" in backend:
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local_rank)
    if verbose and rank == 0:
        logger.info("init_distributed: backend=%s world_size=%d timeout=%ss", backend, world_size,
                    timeout.total_seconds())
    dist.init_process_group(backend=backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timeout)
    _destroy_group_at_exit()


def _destroy_group_at_exit() -> None:
    """Destroy the default group at exit, before the interpreter finalizes, after the
    goodbye and the watchdog's stop: zerolite.shutdown, registered once per process.

    [Note: orderly teardown] Training scripts (DeepSpeed's tutorials, Accelerate's examples)
    end without `destroy_process_group()`; torn down during interpreter finalization, the
    group's threads would meet a half-dead interpreter."""
    from zerolite import shutdown

    shutdown.register()
