"""Run examples/fault_injection.py through the `zerolite` launcher and time what happens.

Used by tests/test_watchdog_faults.py and benchmarks/watchdog_fault_times.py. Each output
line is stamped on arrival, so "fault to exit" is measured from the line the failing rank
prints right before its fault to the launcher's exit.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "fault_injection.py")

FAST_LIMITS = {"ZEROLITE_WATCHDOG_HEARTBEAT_S": "3", "ZEROLITE_WATCHDOG_INTERVAL_S": "0.5",
               "ZEROLITE_WATCHDOG_STALL_S": "5"}
"""Short watchdog limits for tests; the collective timeout (ZEROLITE_TIMEOUT=120) stays far
above them, so it is the watchdog, not gloo, that ends a test job."""


@dataclass
class FaultRun:
    rc: int
    lines: list[tuple[float, str]] = field(default_factory=list)
    """(seconds since launch, line) of the launcher's and every rank's output."""
    ended_s: float = 0.0

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def first(self, pattern: str) -> float | None:
        rx = re.compile(pattern)
        return next((t for t, line in self.lines if rx.search(line)), None)

    @property
    def fault_to_exit_s(self) -> float | None:
        t = self.first(r"fault injection: ")
        return None if t is None else self.ended_s - t

    def rank_pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"\[rank \d\] pid (\d+) started", self.output)]

    def watchdog_lines(self) -> list[str]:
        return [line for _, line in self.lines if line.startswith("zerolite watchdog [rank")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def launch_fault(*script_args: str, nprocs: int = 2, env: dict | None = None,
                 timeout_s: float = 240.0) -> FaultRun:
    full_env = dict(os.environ, ZEROLITE_TIMEOUT="120", **FAST_LIMITS,
                    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key, value in (env or {}).items():  # None: leave the variable out
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    cmd = [sys.executable, "-u", "-m", "zerolite.cli", "--num_procs", str(nprocs), SCRIPT,
           *script_args]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    run = FaultRun(rc=0)

    def read():
        for line in proc.stdout:
            run.lines.append((time.monotonic() - start, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        run.rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        run.rc = proc.wait()
        run.lines.append((time.monotonic() - start, f"<launcher killed after {timeout_s}s>\n"))
    run.ended_s = time.monotonic() - start
    reader.join(timeout=10)
    return run
