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
4. let gloo's worker threads settle (Note: gloo workers at exit).

Each step is skipped where it does not apply: no watchdog (one rank, or switched off), a rank
that failed (its excepthook told the others; they leave through the watchdog), a group the
script destroyed itself (the watchdog then stopped by itself).

[Note: gloo workers at exit] The second way to the same abort (a core dump after the watchdog
was joined, 1 in 40 loaded two-launcher runs): a gloo worker thread (ProcessGroupGloo::runLoop)
dropped the last reference to a finished all-gather's work during finalization; freeing a
tensor whose Python object had died first takes the GIL, and in a finalizing interpreter
that is pthread_exit through a noexcept destructor, std::terminate. The worker had finished
the collective long before but, on a loaded machine, was not scheduled again until then.
destroy_process_group() does not join gloo's threads while anything still references the
group, and torch 2.13's torch.distributed.nn.functional holds group.WORLD in default
arguments, imported by any torch optimizer (torch._dynamo): the threads live on. So before
the interpreter finalizes, the main thread sleeps (GIL released) until no gloo worker thread
is runnable: each has finished what it was doing and waits for work (bounded; Linux /proc).
"""
from __future__ import annotations

import atexit
import logging
import os
import time

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
    if not settle_threads("pt_gloo_runloop"):
        logger.warning("zerolite: a gloo worker thread was still running at exit")


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


def settle_threads(name: str, timeout_s: float = 2.0, poll_s: float = 0.01) -> bool:
    """Sleep (GIL released) until the threads of this process whose OS name is `name` are idle
    (Note: gloo workers at exit): over one sleep none was runnable and none was scheduled at
    all (/proc's schedstat unchanged), so none is running, starved or waiting for the GIL
    (a GIL waiter wakes every switch interval). True when idle, or where /proc cannot tell;
    False after `timeout_s`."""
    tasks = f"/proc/{os.getpid()}/task"
    try:
        tids = [t for t in os.listdir(tasks) if _read(f"{tasks}/{t}/comm").strip() == name]
    except OSError:
        return True
    deadline = time.monotonic() + timeout_s

    def sample():
        return [(_read(f"{tasks}/{t}/stat").rpartition(")")[2].split()[:1],
                 _read(f"{tasks}/{t}/schedstat")) for t in tids]

    before = sample()
    while True:
        time.sleep(poll_s)
        now = sample()
        if now == before and all(state != ["R"] for state, _ in now):
            return True
        if time.monotonic() > deadline:
            return False
        before = now


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the thread ended: idle from here on
        return ""
