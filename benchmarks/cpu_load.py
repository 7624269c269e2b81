"""Another job eating every core, for measurements "on a loaded machine" (issue 24).

    with busy_cores(2) as load:   # two busy-loop processes, ended (by pid) on leaving
        ...
        load.sample()             # 1-minute load average now, kept in load.samples
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys


class Load:
    def __init__(self, pids: list[int]):
        self.pids, self.samples = pids, []

    def sample(self) -> float:
        value = round(os.getloadavg()[0], 2)
        self.samples.append(value)
        return value

    def summary(self) -> dict:
        s = sorted(self.samples) or [0.0]
        return {"busy_loop_processes": len(self.pids), "cpu_count": os.cpu_count(),
                "load_avg_1m": {"min": s[0], "median": s[len(s) // 2], "max": s[-1],
                                "samples": len(self.samples)}}


@contextlib.contextmanager
def busy_cores(n: int):
    """n processes that spin in a Python loop (no sleep, no syscalls) until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    load = Load([p.pid for p in procs])
    try:
        yield load
    finally:
        for p in procs:
            p.kill()
            p.wait()
