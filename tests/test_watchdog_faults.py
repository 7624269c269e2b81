"""The watchdog through the launcher, as users run it: each fault ends every rank within the
limit, with the failed/hung rank named in one `zerolite watchdog` line per live rank.

Limits (zerolite.testing.faults.FAST_LIMITS): heartbeat 3 s, stall floor 5 s, beat 0.5 s;
the collective timeout is 120 s, so a test job that ends fast was ended by the watchdog.
Note: each test starts torchrun and two ranks (~10 s of imports on an idle 2-core machine,
~20 s under load); the fault itself is detected in 1-7 s. The stall cases (deadlock, skipped
collective, slow-but-healthy) are marked slow: `make test-slow`.
"""
from __future__ import annotations

import re

import pytest

from zerolite.testing.faults import FAST_LIMITS, alive, launch_fault

FAULT_TO_EXIT_S = 25.0
"""Fault to launcher exit: detection limit (3-5 s) + one beat + launcher grace (3 s), with
room for a loaded machine."""


def run_fault(mode: str, *extra: str, rank: int = 1, env: dict | None = None):
    run = launch_fault("--steps", "40", "--step-sleep", "0.2", "--fail-rank", str(rank),
                       "--fail-step", "4", "--mode", mode, *extra, env=env)
    assert run.rc != 0, run.output
    assert "done after" not in run.output, run.output
    assert run.fault_to_exit_s is not None, run.output
    assert run.fault_to_exit_s < FAULT_TO_EXIT_S, (run.fault_to_exit_s, run.output)
    pids = run.rank_pids()
    assert len(pids) == 2 and not any(alive(p) for p in pids), run.output
    return run


def named(run, rank: int, what: str) -> list[str]:
    """The watchdog lines (at most one per rank) that name `rank` as `what`."""
    lines = run.watchdog_lines()
    reporters = [re.match(r"zerolite watchdog \[rank (\d)\]", ln).group(1) for ln in lines]
    assert len(reporters) == len(set(reporters)), lines  # ONE line per rank
    rx = re.compile(rf"\]: rank {rank} \(host \S+, pid \d+\) {what}")
    return [ln for ln in lines if rx.search(ln)]


def test_raise_with_lingering_non_daemon_thread_ends_job():
    run = run_fault("raise-thread")
    lines = named(run, 1, "failed: RuntimeError: fault_injection: rank 1 raised at step 4")
    assert lines and "last collective: " in lines[0], run.output


def test_sigstop_of_one_rank_is_declared_hung_and_killed():
    run = run_fault("stop")
    lines = named(run, 1, "stopped responding: no heartbeat for")
    assert lines, run.output
    # its last collective as of its last beat (<= 0.5 s before the stop at step 4; steps are
    # short, so on a loaded 2-core machine the beat can trail the stop by up to 3 steps)
    assert re.search(r"last collective \(as of its last heartbeat\): .* after [123] optimizer",
                     lines[0]), lines
    assert "SIGKILLed 1 process(es)" in run.output, run.output  # the stopped one


@pytest.mark.slow  # 15-45 s: a launcher start plus the stall limit
def test_deadlocked_main_thread_is_declared_hung_with_its_stack():
    # Limits from the zerolite.watchdog_* config keys, none from the environment: with the
    # defaults (45 s floor) this would not end within FAULT_TO_EXIT_S.
    run = run_fault("deadlock", "--watchdog-config", "3,5,5,0.5",
                    env={k: None for k in FAST_LIMITS})
    lines = named(run, 1, r"hung: no progress for \d+s \(limit \d+s\)")
    assert lines and "others: rank 0: " in lines[0], run.output
    assert "in inject" in run.output  # the hung rank dumped where its main thread is


@pytest.mark.slow  # 15-45 s: a launcher start plus the stall limit
def test_rank_that_skips_a_collective_is_named():
    run = run_fault("skip")
    lines = named(run, 1, "hung: no progress")
    assert lines, run.output
    # the line shows the mismatch: rank 0 entered one event more than rank 1
    a, b = (int(x) for x in re.findall(r"\(event #(\d+)\)", lines[0]))
    assert b == a + 1, lines[0]


@pytest.mark.slow  # 15-45 s: a launcher start plus the stall limit
def test_slow_but_healthy_step_is_not_killed():
    # Steps of ~1 s make the limit max(3 s floor, 5 x 1 s) = 5 s; one 4 s step on rank 1
    # is over the floor but within the step-relative limit, so the run must finish.
    run = launch_fault("--steps", "7", "--step-sleep", "1.0", "--fail-rank", "1",
                       "--fail-step", "4", "--mode", "slow", "--slow-s", "4",
                       env={"ZEROLITE_WATCHDOG_STALL_S": "3"})
    assert run.rc == 0, run.output
    assert run.output.count("done after 7 steps") == 2, run.output
    assert not run.watchdog_lines(), run.output
