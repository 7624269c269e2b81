"""Run a function on N real processes joined by a process group on 127.0.0.1.

On CPU ranks are forked (about 0.1 s each, against ~3 s for spawn) and join a gloo group.
With CUDA they are spawned (a process that has touched CUDA cannot fork usable children):
NCCL when every rank gets a GPU of its own, gloo on CUDA tensors when ranks share one (NCCL
refuses two ranks on one device; the one-GPU check machine runs 2 ranks that way).
Each rank has one intra-op thread.
The first rank to fail makes the others be killed at once and its traceback is raised in
the parent: a failure never turns into a hang.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from zerolite.comm.process_group import free_port


class RankFailed(RuntimeError):
    """A rank raised, died or timed out; the message carries its traceback."""


def harness_mode(world_size: int) -> tuple[str, str]:
    """(start method, backend) for `world_size` ranks on this machine."""
    if not torch.cuda.is_available():
        return "fork", "gloo"
    if world_size <= torch.cuda.device_count() and dist.is_nccl_available():
        return "spawn", "nccl"
    return "spawn", "gloo"


def _child(fn, rank, world_size, port, conn, comm_timeout_s, backend, per_node, args, kwargs):
    try:
        # torchrun's variables for `per_node` ranks on each node, node-major
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % per_node),
                          LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node))
        torch.set_num_threads(1)
        # Note: the watchdog is off here unless asked for: this harness already kills every
        # rank at the first failure, and its rank 0 (the store host) ends with os._exit.
        os.environ.setdefault("ZEROLITE_WATCHDOG", "0")
        if torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=comm_timeout_s))
        result = fn(rank, world_size, *args, **kwargs)
        # Plain pickle (by value): torch's multiprocessing reducers would pass tensors as
        # shared-memory fds, which die with this process.
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException:  # noqa: BLE001 - everything must reach the parent
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    finally:
        conn.close()
        # Skip destroy_process_group/atexit: a peer may already be gone, and exiting
        # without teardown is what keeps a failed run from hanging.
        os._exit(0)


def run_ranks(fn, world_size: int, *args, timeout_s: float = 120.0,
              comm_timeout_s: float = 60.0, backend: str | None = None,
              start_method: str | None = None, ranks_per_node: int | None = None,
              **kwargs) -> list:
    """Call `fn(rank, world_size, *args, **kwargs)` on `world_size` processes.

    Returns the per-rank return values (they must pickle). Raises RankFailed with the first
    failing rank's traceback; the other ranks are killed. `backend` overrides the choice of
    `harness_mode` and `start_method` its start method (spawned ranks need `fn` importable by
    module path). `ranks_per_node` (default: all on one node) lays the ranks out on loopback
    "nodes" as torchrun would on that many nodes (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK).
    """
    per_node = ranks_per_node or world_size
    if world_size % per_node:
        raise ValueError(f"ranks_per_node {per_node} does not divide world_size {world_size}")
    method, default = harness_mode(world_size)
    ctx = mp.get_context(start_method or method)
    port = free_port()
    procs, conns = [], []
    for rank in range(world_size):
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, daemon=True,
                        args=(fn, rank, world_size, port, child_conn, comm_timeout_s,
                              backend or default, per_node, args, kwargs))
        p.start()
        child_conn.close()
        procs.append(p)
        conns.append(parent_conn)
    results: list = [None] * world_size
    pending = {conn: rank for rank, conn in enumerate(conns)}
    deadline = time.monotonic() + timeout_s
    failure = None
    try:
        while pending and failure is None:
            left = deadline - time.monotonic()
            if left <= 0:
                failure = (f"timed out after {timeout_s:.0f}s; ranks still running: "
                           f"{sorted(pending.values())}")
                break
            ready = []
            for conn in wait(list(pending), timeout=left):
                rank = pending.pop(conn)
                try:
                    ready.append((rank, *pickle.loads(conn.recv_bytes())))
                except EOFError:
                    procs[rank].join(timeout=5)
                    ready.append((rank, "died", f"rank {rank} died (exit code "
                                                f"{procs[rank].exitcode})"))
            # Note: a rank that died makes its peers raise "Connection reset" at about the same
            # moment; report the death (the cause), not whichever message was read first.
            ready.sort(key=lambda r: r[1] != "died")
            for rank, status, payload in ready:
                if status == "ok":
                    results[rank] = payload
                elif failure is None:
                    failure = payload if status == "died" else f"rank {rank} failed:\n{payload}"
    finally:
        for p in procs:
            if p.is_alive() and failure is not None:
                os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=10)
    if failure is not None:
        raise RankFailed(failure)
    return results
