"""Fail fast through the launcher: a rank that raises or dies brings the whole job down quickly
with a non-zero exit code and the error visible; SIGTERM to the launcher stops every rank."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "fault_injection.py")
BOUND_S = 60


def _env():
    return dict(os.environ, ZEROLITE_TIMEOUT="20",
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def launch(*script_args):
    cmd = [sys.executable, "-m", "zerolite.cli", "--num_procs", "2", SCRIPT, *script_args]
    start = time.monotonic()
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=BOUND_S + 30)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - start


def rank_pids(output: str) -> list[int]:
    return [int(p) for p in re.findall(r"\[rank \d\] pid (\d+) started", output)]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_training_without_failure_exits_0():
    rc, out, elapsed = launch("--steps", "3")
    assert rc == 0, out
    assert "torch.distributed.run --nnodes=1 --nproc-per-node=2" in out  # printed command
    assert "step 3 loss" in out and out.count("done after 3 steps") == 2
    assert elapsed < BOUND_S


def test_raise_on_one_rank_stops_all_ranks():
    rc, out, elapsed = launch("--steps", "50", "--fail-rank", "1", "--fail-step", "2",
                              "--mode", "raise")
    assert rc != 0
    assert elapsed < BOUND_S, f"took {elapsed:.0f}s"
    assert "RuntimeError: fault_injection: rank 1 raised at step 2" in out
    assert "done after" not in out
    pids = rank_pids(out)
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_sigkill_of_one_rank_stops_all_ranks():
    rc, out, elapsed = launch("--steps", "50", "--fail-rank", "0", "--fail-step", "2",
                              "--mode", "kill")
    assert rc != 0
    assert elapsed < BOUND_S, f"took {elapsed:.0f}s"
    assert "SIGKILL" in out and "done after" not in out
    pids = rank_pids(out)
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_sigterm_to_launcher_stops_all_ranks():
    cmd = [sys.executable, "-m", "zerolite.cli", "--num_procs", "2", SCRIPT, "--steps", "10000",
           "--step-sleep", "0.05"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + BOUND_S
        while not any(line.startswith("step 2 ") for line in lines):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "training did not start:\n" + "".join(lines)
            time.sleep(0.1)
        pids = rank_pids("".join(lines))
        assert len(pids) == 2
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=BOUND_S)
        stopped_in = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    assert rc != 0, "".join(lines)
    assert stopped_in < 30, f"launcher took {stopped_in:.0f}s to stop"
    assert not any(alive(p) for p in pids), "a rank outlived the launcher"
    assert "stopped by SIGTERM" in "".join(lines)
