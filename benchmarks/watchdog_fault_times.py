"""Time from fault to exit for each fault kind, through the `zerolite` launcher.

    PYTHONPATH=. python -m benchmarks.watchdog_fault_times [--defaults] [--repeat N] [--load K]

Each run trains examples/fault_injection.py on 2 CPU ranks; rank 1 fails at step 4 in one
way; the time is from the line it prints right before the fault to the launcher's exit.
By default the tests' short limits are used (heartbeat 3 s, stall floor 5 s, beat 0.5 s);
--defaults runs with the shipped defaults (20 s, 45 s, 1 s). --load K: K busy-loop processes
eat the cores meanwhile (benchmarks/cpu_load.py). Each run records whether every rank process
had ended when the launcher returned and who named rank 1: the watchdog's line, or (SIGKILL,
no Python left to speak) the launcher's failure summary. Results:
benchmarks/results/watchdog_fault_times[_defaults].json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics

from benchmarks.cpu_load import busy_cores
from zerolite.testing.faults import FAST_LIMITS, alive, launch_fault

MODES = ("raise", "raise-thread", "kill", "stop", "deadlock", "skip")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def named_by(run) -> str | None:
    if any(re.search(r"\]: rank 1 \(host", ln) for ln in run.watchdog_lines()):
        return "watchdog line"
    if re.search(r"rank\s*:\s*1 \(local_rank: 1\)", run.output):
        return "launcher summary"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--defaults", action="store_true", help="shipped limits, not the tests'")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--load", type=int, default=0, help="busy-loop processes beside the runs")
    args = p.parse_args()
    if args.defaults:
        leftover = [k for k in os.environ if k.startswith("ZEROLITE_WATCHDOG")]
        assert not leftover, f"unset {leftover}: --defaults measures the shipped defaults"
    env = {k: None for k in FAST_LIMITS} if args.defaults else None
    results = {}
    with busy_cores(args.load) if args.load else contextlib.nullcontext() as load:
        for mode in args.modes.split(","):
            times, verdict_s, named, ended, rcs, lines = [], [], [], [], [], []
            for _ in range(args.repeat):
                run = launch_fault("--steps", "60", "--step-sleep", "0.2", "--fail-rank", "1",
                                   "--fail-step", "4", "--mode", mode, env=env, timeout_s=400)
                times.append(round(run.fault_to_exit_s, 2))
                first = run.first(r"^zerolite watchdog \[rank")
                fault = run.first(r"fault injection: ")
                verdict_s.append(None if first is None else round(first - fault, 2))
                lines.append(run.watchdog_lines()[:1])
                named.append(named_by(run))
                ended.append(not any(alive(pid) for pid in run.rank_pids()))
                rcs.append(run.rc)
                if load:
                    load.sample()
            results[mode] = {"fault_to_exit_s": times, "median_s": statistics.median(times),
                             "max_s": max(times), "fault_to_watchdog_line_s": verdict_s,
                             "rank_1_named_by": named, "every_rank_ended": ended,
                             "launcher_rc": rcs, "first_watchdog_line": lines}
            print(f"{mode:13s} fault->exit {times} s (->line {verdict_s}); rank 1 named by {named}; ranks ended "
                  f"{ended}; rc {rcs}", flush=True)
    name = "watchdog_fault_times_defaults.json" if args.defaults else "watchdog_fault_times.json"
    with open(os.path.join(OUT, name), "w") as f:
        json.dump({"limits": "defaults" if args.defaults else FAST_LIMITS,
                   "load_avg_1m_at_end": os.getloadavg()[0],
                   **(load.summary() if load else {}), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
