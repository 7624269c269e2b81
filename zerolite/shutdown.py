"""The end of a run, in order, once per process (an atexit handler; issue 24).

1. goodbye: while the watchdog still runs, every rank that finished normally meets the others
   in one all-reduce of the process group (not the store). No rank tears anything down while
   another is still running, so the store's host (rank 0 for env:// and tcp://; torchrun's
   agent keeps its own until every node is done) cannot vanish under a rank that is still
   working. A rank that never arrives is judged by the watchdog as at any other collective.
2. stop the watchdog: its thread is joined, so it is in no store call when the interpreter
   finalizes (Note: joined at exit, zerolite/watchdog/heartbeat.py), then its last beat says
   "done".
3. destroy the default process group, while the interpreter is whole.

Each step is skipped where it does not apply: no watchdog (one rank, or switched off), a rank
that failed (its excepthook told the others; they leave through the watchdog), a group the
script destroyed itself (the watchdog then stopped by itself).
"""
from __future__ import annotations

import atexit
import logging

import torch
import torch.distributed as dist

from zerolite import watchdog
from zerolite.comm.last_collective import entered, set_phase

logger = logging.getLogger("zerolite")

_registered = False


def register() -> None:
    """Run `shutdown` at exit (idempotent)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(shutdown)


def shutdown() -> None:
    """Goodbye, stop the watchdog, destroy the group; never raises (it runs at exit)."""
    wd = watchdog.active()
    # Note: not `state == "running"`: the thread marks the rank "done" once the main thread
    # has ended, which it has here; only a failed rank skips the goodbye.
    watched = wd is not None and wd.alive and wd.state != "failed"
    if watched and _group_alive():
        try:
            goodbye()
        except Exception as exc:  # noqa: BLE001 - a peer that left early; exiting anyway
            logger.debug("zerolite: goodbye at exit failed: %s", exc)
    if wd is not None and not wd.stop():
        logger.warning("zerolite: the watchdog thread did not stop within its store timeout; "
                       "the interpreter may abort at exit")
    if _group_alive():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - exiting anyway: say it, never raise
            logger.debug("zerolite: destroy_process_group at exit failed: %s", exc)


def goodbye() -> None:
    """One all-reduce of a one-element tensor: returns when every rank got here."""
    set_phase("exit")
    entered("goodbye")
    backend = str(dist.get_backend())
    if "gloo" in backend or not torch.cuda.is_available():
        flag = torch.zeros(1)
    else:
        flag = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(flag)


def _group_alive() -> bool:
    return dist.is_available() and dist.is_initialized()
