"""Time from fault to exit for each fault kind, through the `zerolite` launcher.

    PYTHONPATH=. python -m benchmarks.watchdog_fault_times [--defaults] [--repeat N]

Each run trains examples/fault_injection.py on 2 CPU ranks; rank 1 fails at step 4 in one
way; the time is from the line it prints right before the fault to the launcher's exit.
By default the tests' short limits are used (heartbeat 3 s, stall floor 5 s, beat 0.5 s);
--defaults runs with the shipped defaults (20 s, 45 s, 1 s). Results:
benchmarks/results/watchdog_fault_times[_defaults].json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

from zerolite.testing.faults import FAST_LIMITS, alive, launch_fault

MODES = ("raise", "raise-thread", "kill", "stop", "deadlock", "skip")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--defaults", action="store_true", help="shipped limits, not the tests'")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES))
    args = p.parse_args()
    env = {k: None for k in FAST_LIMITS} if args.defaults else None
    results = {}
    for mode in args.modes.split(","):
        times, named = [], []
        for _ in range(args.repeat):
            run = launch_fault("--steps", "60", "--step-sleep", "0.2", "--fail-rank", "1",
                               "--fail-step", "4", "--mode", mode, env=env, timeout_s=400)
            times.append(round(run.fault_to_exit_s, 2))
            named.append(any("rank 1 (" in ln for ln in run.watchdog_lines()))
            assert not any(alive(pid) for pid in run.rank_pids()), run.output
        results[mode] = {"fault_to_exit_s": times, "median_s": statistics.median(times),
                         "watchdog_named_rank_1": named}
        print(f"{mode:13s} fault->exit {times} s; watchdog line names rank 1: {named}", flush=True)
    name = "watchdog_fault_times_defaults.json" if args.defaults else "watchdog_fault_times.json"
    with open(os.path.join(OUT, name), "w") as f:
        json.dump({"limits": "defaults" if args.defaults else FAST_LIMITS,
                   "load_avg_1m_at_end": os.getloadavg()[0], "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
