"""Distributed watchdog: no hang, ever (see heartbeat.py for the mechanism, judge.py for the
rules). `initialize` starts it on every rank of a multi-rank run.

Settings: the `zerolite.watchdog*` config keys, overridden by environment variables (so an
operator can change them without editing the config):

    ZEROLITE_WATCHDOG=0|1                      off / on (default on)
    ZEROLITE_WATCHDOG_HEARTBEAT_S=20           no heartbeat for this long = hung
    ZEROLITE_WATCHDOG_STALL_S=45               floor of the no-progress limit
    ZEROLITE_WATCHDOG_STALL_FACTOR=5           x the slowest step seen
    ZEROLITE_WATCHDOG_INTERVAL_S=1             heartbeat period

Code that legitimately spends long without collectives on some ranks only (checkpoint I/O,
rank-0 evaluation) runs inside `with zerolite.watchdog.suspended():`; heartbeats go on.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import traceback

from zerolite.comm.last_collective import set_phase
from zerolite.errors import ZeroliteError
from zerolite.watchdog.heartbeat import Watchdog, store_client
from zerolite.watchdog.judge import Settings

logger = logging.getLogger("zerolite")

_ENV = {"heartbeat_timeout_s": "ZEROLITE_WATCHDOG_HEARTBEAT_S",
        "stall_timeout_s": "ZEROLITE_WATCHDOG_STALL_S",
        "stall_step_factor": "ZEROLITE_WATCHDOG_STALL_FACTOR",
        "interval_s": "ZEROLITE_WATCHDOG_INTERVAL_S"}
_ACTIVE: Watchdog | None = None
_STARTS = 0


def _env_number(name: str, default: float, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ZeroliteError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum or value != value or value == float("inf"):
        raise ZeroliteError(f"{name}={raw!r} must be a finite number >= {minimum}")
    return value


def resolve(extras) -> tuple[bool, Settings]:
    """(enabled, Settings) from the config's `zerolite` block and the environment."""
    enabled = extras.watchdog
    raw = os.environ.get("ZEROLITE_WATCHDOG")
    if raw is not None:
        if raw not in ("0", "1"):
            raise ZeroliteError(f"ZEROLITE_WATCHDOG={raw!r}: expected 0 or 1")
        enabled = raw == "1"
    s = Settings(
        heartbeat_timeout_s=_env_number(_ENV["heartbeat_timeout_s"],
                                        extras.watchdog_heartbeat_timeout_s, 1e-3),
        stall_timeout_s=_env_number(_ENV["stall_timeout_s"], extras.watchdog_stall_timeout_s, 1e-3),
        stall_step_factor=_env_number(_ENV["stall_step_factor"],
                                      extras.watchdog_stall_step_factor, 1.0),
        interval_s=_env_number(_ENV["interval_s"], extras.watchdog_interval_s, 1e-3))
    if s.interval_s * 3 > s.heartbeat_timeout_s:
        raise ZeroliteError(f"watchdog: interval {s.interval_s}s must be at most a third of the "
                            f"heartbeat limit {s.heartbeat_timeout_s}s")
    return enabled, s


def start(extras, rank: int, world_size: int) -> Watchdog | None:
    """Start this rank's watchdog (one at a time per process; world size 1 needs none).

    It talks through the default process group's store, whatever the init method was."""
    global _ACTIVE, _STARTS
    enabled, settings = resolve(extras)
    if (_ACTIVE is not None and _ACTIVE.alive) or not enabled or world_size < 2:
        return _ACTIVE
    _STARTS += 1  # a group destroyed and made again gets a watchdog with fresh keys
    prefix = (f"zerolite/watchdog/{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/"
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_STARTS}/")
    store_timeout_s = max(settings.heartbeat_timeout_s / 2, 1.0)
    _ACTIVE = Watchdog(store_client(store_timeout_s), rank, world_size, settings, prefix,
                       store_timeout_s=store_timeout_s)
    _install_exit_hooks()
    _ACTIVE.start()
    if rank == 0:
        logger.info("zerolite watchdog: heartbeat every %.3gs, hung after %.3gs without one or "
                    "max(%.3gs, %.3g x slowest step) without progress", settings.interval_s,
                    settings.heartbeat_timeout_s, settings.stall_timeout_s,
                    settings.stall_step_factor)
    return _ACTIVE


_hook_installed = False


def _install_exit_hooks() -> None:
    """Once per process: an uncaught exception marks the active watchdog failed. The normal
    end (goodbye, stop, destroy, in that order) is zerolite.shutdown's atexit handler."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        # Note: before Python joins non-daemon threads: the others learn of the failure now,
        # and our thread ends this process even if a lingering thread would keep it alive.
        last = "".join(traceback.format_exception_only(exc_type, exc)).strip().splitlines()
        previous(exc_type, exc, tb)
        if _ACTIVE is not None and _ACTIVE.alive:
            _ACTIVE.mark_failed(last[-1][:300] if last else exc_type.__name__)

    sys.excepthook = excepthook


@contextlib.contextmanager
def suspended():
    """No stall verdicts on any rank while this rank is inside (heartbeats still count)."""
    wd = _ACTIVE
    if wd is not None:
        wd.suspended += 1
    try:
        yield
    finally:
        if wd is not None:
            wd.suspended -= 1


def checkpoint_io(method):
    """Engine checkpoint methods: phase "checkpoint", no stall verdicts while inside (file
    I/O takes as long as it takes, on some ranks longer than on others)."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        set_phase("checkpoint")
        with suspended():
            return method(*args, **kwargs)

    return wrapper


def active() -> Watchdog | None:
    return _ACTIVE
