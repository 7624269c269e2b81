"""Does the watchdog, at its shipped defaults, kill a slow but healthy run on a loaded machine?

    PYTHONPATH=. python -m benchmarks.watchdog_false_positives [--runs 20] [--load 2]

Each run trains examples/fault_injection.py on 2 CPU ranks through the `zerolite` launcher with
the shipped watchdog defaults (heartbeat limit 20 s, stall floor 45 s, factor 5, beat 1 s; no
ZEROLITE_WATCHDOG_* variable set), while --load busy-loop processes eat the cores:
--steps steps of --step-sleep s each, and at step --slow-step rank 1 does --slow-s seconds of
rank-local work (no collective: rank 0 waits for it in the next all-gather), below the 45 s
floor. Healthy: it must exit 0 with no watchdog line. A kill = a non-zero exit or a watchdog
verdict. Result: benchmarks/results/<--out>.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.cpu_load import busy_cores
from zerolite.testing.faults import FAST_LIMITS, launch_fault

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--load", type=int, default=2, help="busy-loop processes beside the runs")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=1.5)
    p.add_argument("--slow-step", type=int, default=8)
    p.add_argument("--slow-s", type=float, default=30.0)
    p.add_argument("--out", default="watchdog_false_positives.json")
    a = p.parse_args(argv)
    leftover = [k for k in os.environ if k.startswith("ZEROLITE_WATCHDOG")]
    assert not leftover, f"unset {leftover}: this measures the shipped defaults"
    env = {k: None for k in FAST_LIMITS}  # launch_fault's short test limits out: defaults
    runs, start = [], time.monotonic()
    with busy_cores(a.load) as load:
        load.sample()
        for i in range(a.runs):
            run = launch_fault("--steps", str(a.steps), "--step-sleep", str(a.step_sleep),
                               "--fail-rank", "1", "--fail-step", str(a.slow_step), "--mode",
                               "slow", "--slow-s", str(a.slow_s), env=env, timeout_s=600)
            verdicts = run.watchdog_lines()
            done = run.output.count(f"done after {a.steps} steps")
            killed = run.rc != 0 or bool(verdicts)
            rec = {"i": i, "rc": run.rc, "seconds": round(run.ended_s, 1), "killed": killed,
                   "ranks_done": done, "watchdog_lines": verdicts,
                   "load_avg_1m": load.sample()}
            if killed or done != 2:
                rec["output_tail"] = run.output[-8000:]
            runs.append(rec)
            print(f"{i:2d} rc {run.rc} {rec['seconds']:5.1f}s ranks done {done} load "
                  f"{rec['load_avg_1m']:.1f}{'  KILLED: ' + verdicts[0] if verdicts else ''}",
                  flush=True)
    result = {"limits": "shipped defaults (heartbeat 20 s, stall floor 45 s, factor 5, beat 1 s)",
              "workload": {"steps": a.steps, "step_sleep_s": a.step_sleep,
                           "slow_rank": 1, "slow_step": a.slow_step, "slow_s": a.slow_s},
              "wall_s": round(time.monotonic() - start), **load.summary(),
              "summary": {"runs": len(runs), "exit_0": sum(r["rc"] == 0 for r in runs),
                          "false_positives": sum(r["killed"] for r in runs),
                          "seconds": {"min": min(r["seconds"] for r in runs),
                                      "max": max(r["seconds"] for r in runs)}},
              "runs": runs}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, a.out), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["summary"]))
    return 0 if result["summary"]["false_positives"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
