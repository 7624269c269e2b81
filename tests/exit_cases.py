"""Jobs of tests/compat_scripts/exit_modes.py as users start them (issue 24): two `zerolite`
launchers on loopback (one node each), one launcher with two processes, or plain processes
that build their own group. A job that does not end in time is stopped and reported as a hang;
no job outlives its timeout.

    python -m tests.exit_cases --root DIR --jobs 20 [--store-delay-s 0.5]   # rates of a tree
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "exit_modes.py")
ABORT = "terminate called without an active exception"


def aborted(job: "Job") -> bool:
    """A rank died of SIGABRT (torchrun's report) or printed libstdc++'s terminate line."""
    return ABORT in job.output or "(SIGABRT)" in job.output


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Job:
    kind: str
    rcs: list
    """Exit code of each launcher (or process); "hang" for one stopped at the timeout."""
    outputs: list
    seconds: float

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.rcs)

    @property
    def output(self) -> str:
        return "\n".join(f"--- {self.kind} {i} (rc {rc}) ---\n{out}"
                         for i, (rc, out) in enumerate(zip(self.rcs, self.outputs)))


def _env(root: str, extra: dict | None) -> dict:
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60")
    env.update(extra or {})
    return env


def _commands(kind: str, args: list, script: str = SCRIPT) -> tuple[list, list]:
    """(commands, per-command extra env) of a job running `script` (exit_modes.py unless told)."""
    if kind == "two-launchers":
        port = str(free_port())
        return ([[sys.executable, "-m", "zerolite.cli", "--num_nodes", "2", "--node_rank",
                  str(r), "--num_procs", "1", "--master_addr", "127.0.0.1", "--master_port",
                  port, script, *args] for r in (0, 1)], [{}, {}])
    if kind == "one-launcher":
        return [[sys.executable, "-m", "zerolite.cli", "--num_procs", "2", script, *args]], [{}]
    if kind == "plain":  # the script's own init_process_group; MASTER_PORT where nobody listens
        base = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        return ([[sys.executable, script, *args]] * 2,
                [dict(base, RANK=str(r), LOCAL_RANK=str(r)) for r in (0, 1)])
    raise ValueError(kind)


def run_job(kind: str, *args: str, root: str = ROOT, env: dict | None = None,
            timeout_s: float = 150.0, cwd: str | None = None, script: str = SCRIPT) -> Job:
    cmds, envs = _commands(kind, list(args), script)
    start = time.monotonic()
    procs = [subprocess.Popen(c, env=_env(root, dict(env or {}, **e)), cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", start_new_session=True)
             for c, e in zip(cmds, envs)]
    rcs, outputs = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, start + timeout_s - time.monotonic()))
            rcs.append(p.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)  # the launcher forwards it and kills its ranks
            try:
                out, _ = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
            rcs.append("hang")
        outputs.append(out)
    return Job(kind, rcs, outputs, time.monotonic() - start)


# The ways a finished run ends: the user's own destroy_process_group() or not, sys.exit(0) or
# not, one node finishing first (its rank lingers 0 s, the other 2 s).
ENDINGS = [("--end", "return"), ("--end", "sys-exit"), ("--end", "destroy"),
           ("--end", "destroy-sys-exit"),
           ("--end", "return", "--linger-rank", "1", "--linger-s", "2"),
           ("--end", "destroy", "--linger-rank", "0", "--linger-s", "2")]
INFLIGHT = {"ZEROLITE_WATCHDOG_INTERVAL_S": "0.1"}
"""With --store-delay-s 0.5: a heartbeat is in flight at almost any moment, the script's end
included (as on a loaded machine, where the store answers late)."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", default=ROOT, help="tree whose zerolite runs (PYTHONPATH)")
    p.add_argument("--jobs", type=int, default=10, help="jobs of each kind")
    p.add_argument("--kinds", default="two-launchers,one-launcher")
    p.add_argument("--store-delay-s", default="0", help="0: the plain script, as users run it")
    a = p.parse_args(argv)
    env = INFLIGHT if float(a.store_delay_s) > 0 else {}
    failed = 0
    for i in range(a.jobs):
        for kind in a.kinds.split(","):
            ending = ENDINGS[i % len(ENDINGS)]
            job = run_job(kind, *ending, "--store-delay-s", a.store_delay_s, root=a.root,
                          env=env)
            failed += not job.ok
            print(f"{i} {kind} {' '.join(ending)}: {job.rcs} {job.seconds:.0f}s"
                  f"{' ABORT' if aborted(job) else ''}", flush=True)
    print(f"failed {failed} of {a.jobs * len(a.kinds.split(','))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
