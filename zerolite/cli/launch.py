"""`zerolite [launch] ...`: DeepSpeed's launcher flags, translated into one torchrun command.

    zerolite --num_procs 2 train.py --deepspeed_config ds.json          # CPU: 2 gloo ranks
    zerolite --num_gpus 8 train.py ...                                  # one node, 8 GPUs
    zerolite --hostfile hosts --include "w0:0,1@w1:0,1" train.py ...    # run on EVERY node
    zerolite --as-deepspeed accelerate launch --use_deepspeed ... train.py  # a launcher command

Hostfile format and ``--include`` / ``--exclude``: zerolite/cli/hostfile.py (as DeepSpeed).

[Note: no ssh] DeepSpeed's launcher logs into every host with pdsh and starts the ranks there.
zerolite does not: it prints and runs the torchrun command for THIS node only, and the user
runs the same ``zerolite ...`` line on every node (a job scheduler usually does that). The
node's rank comes from ``--node_rank`` or from finding this machine's hostname in the hostfile.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

from zerolite.cli.hostfile import LaunchError, filter_pool, parse_hostfile, read_hostfile

__all__ = ["LaunchError", "build_parser", "parse_hostfile", "plan", "main"]

DEFAULT_MASTER_PORT = 29500
SHUTDOWN_GRACE_S = 15.0
"""After a SIGINT/SIGTERM, how long torchrun gets to stop its workers before everything is
SIGKILLed (torchrun itself would wait 30 s)."""
WATCHDOG_GRACE_S = 3.0
"""After a rank's watchdog reported a failed or hung rank (SIGUSR1 from zerolite.watchdog),
how long the other ranks get to print their line and exit before what is left is SIGKILLed
(a SIGSTOPped rank never exits by itself; SIGKILL reaches it)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zerolite [launch]", allow_abbrev=False,
        description="Start a training script on this node with torch.distributed.run "
                    "(DeepSpeed launcher flags). Multi-node: run the same command on each node.")
    p.add_argument("-H", "--hostfile", default=None,
                   help="file of 'hostname slots=N' lines (DeepSpeed format)")
    p.add_argument("-i", "--include", default="", help='hosts/slots to use, e.g. "w0:0,1@w1"')
    p.add_argument("-e", "--exclude", default="", help='hosts/slots to leave out, e.g. "w1:3"')
    p.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts")
    p.add_argument("--num_gpus", "--num_accelerators", dest="num_gpus", type=int, default=-1,
                   help="processes (GPUs) per node")
    p.add_argument("--num_procs", type=int, default=-1,
                   help="processes per node; without GPUs these are CPU ranks on gloo (default 1)")
    p.add_argument("--node_rank", type=int, default=-1,
                   help="this node's rank (default: found from the hostname in the hostfile)")
    p.add_argument("--master_addr", default="", help="rendezvous host (default: first host)")
    p.add_argument("--master_port", type=int, default=-1,
                   help=f"rendezvous port (default {DEFAULT_MASTER_PORT}; one node: a free port)")
    p.add_argument("--max_restarts", type=int, default=0, help="torchrun --max-restarts")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print the torchrun command and exit")
    p.add_argument("--as-deepspeed", "--as_deepspeed", dest="as_deepspeed", action="store_true",
                   help="run an unchanged DeepSpeed program: `import deepspeed` means zerolite "
                        "in every rank (and the processes it starts)")
    p.add_argument("--no_local_rank", "--no-local-rank", dest="no_local_rank",
                   action="store_true",
                   help="with --as-deepspeed: do not pass --local_rank=N to the script "
                        "(DeepSpeed's launcher passes it by default)")
    p.add_argument("--module", action="store_true",
                   help="run the script as a Python module, as `python -m` (DeepSpeed's flag)")
    p.add_argument("user_script", help="training script; with --as-deepspeed also a launcher "
                   "command on PATH (accelerate, torchrun, deepspeed) to run with the alias")
    p.add_argument("user_args", nargs=argparse.REMAINDER, help="arguments of the script")
    return p


# -- the plan ------------------------------------------------------------------------------
def _local_names() -> set[str]:
    names = {socket.gethostname(), socket.gethostname().split(".")[0]}
    try:
        names.add(socket.getfqdn())
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return {n for n in names if n}


def _local_accelerators() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan(args: argparse.Namespace, *, gpus: int | None = None,
         local_names: set[str] | None = None) -> dict:
    """Resolve flags into {cmd, env, nnodes, nproc, node_rank, hosts}; raises LaunchError."""
    gpus = _local_accelerators() if gpus is None else gpus
    for flag in ("num_nodes", "num_gpus", "num_procs"):
        value = getattr(args, flag)
        if value == 0 or value < -1:
            raise LaunchError(f"--{flag} {value}: must be a positive integer")
    if args.max_restarts < 0:
        raise LaunchError(f"--max_restarts {args.max_restarts}: must be >= 0")
    if args.master_port != -1 and not 0 < args.master_port < 65536:
        raise LaunchError(f"--master_port {args.master_port}: must be in 1..65535")
    if args.num_gpus > 0 and args.num_procs > 0 and args.num_gpus != args.num_procs:
        raise LaunchError(f"--num_gpus {args.num_gpus} and --num_procs {args.num_procs} "
                          "disagree; pass one of them")
    per_node = args.num_procs if args.num_procs > 0 else args.num_gpus
    if (args.include or args.exclude) and (args.num_nodes > 0 or per_node > 0):
        flag = "--include" if args.include else "--exclude"
        raise LaunchError(f"{flag} cannot be combined with --num_nodes/--num_gpus/--num_procs "
                          "(as in DeepSpeed); choose hosts and slots with one of them")
    if args.hostfile is None and args.num_nodes > 1:
        if not args.master_addr or args.node_rank < 0:
            raise LaunchError(f"--num_nodes {args.num_nodes} without --hostfile needs "
                              "--master_addr and --node_rank (run the command on every node)")

    if args.hostfile is not None:
        pool = {h: list(range(n)) for h, n in read_hostfile(args.hostfile).items()}
    else:
        local = per_node if per_node > 0 else max(gpus, 1)
        pool = {"localhost": list(range(local))}
    active = filter_pool(pool, args.include, args.exclude)
    if args.num_nodes > 0 and args.hostfile is not None:
        if args.num_nodes > len(active):
            raise LaunchError(f"--num_nodes {args.num_nodes}: the hostfile has only "
                              f"{len(active)} host(s)")
        active = dict(list(active.items())[:args.num_nodes])
    if per_node > 0 and args.hostfile is not None:
        for h, slots in active.items():
            if per_node > len(slots):
                raise LaunchError(f"--num_gpus/--num_procs {per_node}: host {h!r} has only "
                                  f"{len(slots)} slot(s) in the hostfile")
        active = {h: s[:per_node] for h, s in active.items()}

    counts = {h: len(s) for h, s in active.items()}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{h}={n}" for h, n in counts.items())
        raise LaunchError(f"hosts have different slot counts ({shown}); torchrun needs the same "
                          "number of processes on every node: use --num_gpus or --include")
    hosts = list(active)
    nnodes = len(hosts) if args.hostfile is not None else max(args.num_nodes, 1)
    nproc = next(iter(counts.values()))

    node_rank = args.node_rank
    if node_rank >= nnodes:
        raise LaunchError(f"--node_rank {node_rank}: must be < the number of nodes ({nnodes})")
    if node_rank < 0:
        if nnodes == 1:
            node_rank = 0
        else:
            names = _local_names() if local_names is None else local_names
            matches = [i for i, h in enumerate(hosts) if h in names]
            if not matches:
                raise LaunchError(
                    f"--node_rank: this machine ({', '.join(sorted(names))}) is not among the "
                    f"hosts ({', '.join(hosts)}); pass --node_rank")
            node_rank = matches[0]

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
           f"--nproc-per-node={nproc}"]
    if nnodes == 1 and not args.master_addr and args.master_port == -1:
        # Note: one node and no address asked for: --standalone lets torchrun pick a free port,
        # so two jobs (or two test runs) on one machine never collide on 29500.
        cmd.append("--standalone")
    else:
        addr = args.master_addr or (hosts[0] if args.hostfile is not None else "127.0.0.1")
        port = args.master_port if args.master_port != -1 else DEFAULT_MASTER_PORT
        cmd += [f"--node-rank={node_rank}", f"--master-addr={addr}", f"--master-port={port}"]
    cmd.append(f"--max-restarts={args.max_restarts}")
    module = getattr(args, "module", False)
    if getattr(args, "as_deepspeed", False):
        # torchrun -m: each rank runs zerolite.as_deepspeed, which installs the alias first.
        local_rank = [] if args.no_local_rank else ["--pass_local_rank"]
        target = ["-m", args.user_script] if module else [args.user_script]
        cmd += ["-m", "zerolite.as_deepspeed", *local_rank, *target, *args.user_args]
    else:
        cmd += [*(["--module"] if module else []), args.user_script, *args.user_args]

    env = {}
    my_slots = active[hosts[node_rank]] if args.hostfile is not None else active["localhost"]
    if gpus > 0 and my_slots != list(range(len(my_slots))):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, my_slots))
    return {"cmd": cmd, "env": env, "nnodes": nnodes, "nproc": nproc, "node_rank": node_rank,
            "hosts": hosts, "gpus": gpus}


def format_command(p: dict) -> str:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in p["env"].items())
    return prefix + shlex.join(p["cmd"])


# -- running -------------------------------------------------------------------------------
def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(procs: list) -> None:
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass


def _alive(procs: list) -> list:
    import psutil

    out = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def run(p: dict) -> int:
    """Run torchrun; forward SIGINT/SIGTERM to it and make sure every rank is gone at the end."""
    _RAN.append(True)
    env = dict(os.environ, **p["env"], ZEROLITE_LAUNCHER_PID=str(os.getpid()))
    # Note: own session, so a Ctrl-C in the terminal reaches torchrun once (through us), and
    # torchrun's workers (each in its own session) are tracked by pid, not by process group.
    child = subprocess.Popen(p["cmd"], env=env, start_new_session=True)
    received: list[int] = []
    first_signal_at: list[float] = []

    def on_signal(signum, _frame):
        received.append(signum)
        first_signal_at.append(time.monotonic())
        if child.poll() is None:
            child.send_signal(signal.SIGKILL if len(received) > 1 else signum)

    watchdog_at: list[float] = []

    def on_watchdog(_signum, _frame):
        watchdog_at.append(time.monotonic())

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_watchdog)
    known: dict[int, object] = {}
    try:
        while True:
            try:
                rc = child.wait(timeout=0.2 if watchdog_at else 0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            for proc in _descendants(child.pid):
                known[proc.pid] = proc
            if first_signal_at and time.monotonic() - first_signal_at[0] > SHUTDOWN_GRACE_S:
                _kill_all(list(known.values()))
                child.kill()
            if watchdog_at and time.monotonic() - watchdog_at[0] > WATCHDOG_GRACE_S:
                left = _alive(list(known.values()))
                _kill_all(left)
                child.kill()
                child.wait()
                sys.stderr.write("zerolite: the watchdog ended the job (its line is above); "
                                 f"SIGKILLed {len(left)} process(es) that were left\n")
                rc = 1
                break
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        # Whatever torchrun left behind (it was SIGKILLed, or crashed) is killed here: no rank
        # outlives the launcher.
        _kill_all(list(known.values()))
    if received:
        sys.stderr.write(f"zerolite: stopped by {signal.Signals(received[0]).name}\n")
        return 128 + received[0]  # as a shell reports a job stopped by that signal
    return rc if rc >= 0 else 128 - rc


_PROCESS_FLAGS = ("hostfile", "include", "exclude", "num_nodes", "num_gpus", "num_procs",
                  "node_rank", "master_addr", "master_port", "max_restarts", "no_local_rank",
                  "module")


def launcher_command(args: argparse.Namespace) -> dict | None:
    """`zerolite --as-deepspeed COMMAND ARGS`, where COMMAND is a program on PATH and not a
    script (`accelerate launch ...`, `torchrun ...`): {cmd, env} that runs it once, on this
    node, with the alias active in it and in every process it starts; None for a script."""
    from zerolite.compat import alias_env

    if not args.as_deepspeed or args.module or os.path.exists(args.user_script):
        return None
    env = alias_env(dict(os.environ))
    # PATH, then this interpreter's own folder (a venv's commands, activated or not)
    path = os.pathsep.join([env["PATH"], os.path.dirname(sys.executable)])
    exe = None if args.user_script.endswith(".py") else shutil.which(args.user_script, path=path)
    if exe is None:
        raise LaunchError(f"{args.user_script!r}: no such script, nor a command of that name "
                          "on PATH")
    defaults = build_parser().parse_args(["x"])
    given = [f for f in _PROCESS_FLAGS if getattr(args, f) != getattr(defaults, f)]
    if given:
        raise LaunchError(f"--{given[0]}: with --as-deepspeed {args.user_script} ... the "
                          f"command starts the processes; pass it {args.user_script}'s own "
                          "flags instead")
    return {"cmd": [exe, *args.user_args], "env": env}


def exit_now(rc: int) -> None:
    """End the launcher process with `rc` now that its job is over.

    [Note: launcher exit] By then torchrun has exited and every rank is gone; what is left is
    this interpreter's finalization, which after `import torch` (plan() counts GPUs) takes
    seconds on a loaded machine and delays the job's end past the watchdog's verdict (issue
    24's fault matrix measured it). Nothing of the launcher's needs finalizing: flush the
    output and leave.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


def main(argv: list[str], *, exit_process: bool = False) -> int:
    """`exit_process`: the process is the `zerolite` command itself (not a caller's, as in the
    tests): once a job ran, end it at once with the job's exit code (exit_now)."""
    rc = _main(argv)
    if exit_process and rc is not None and _RAN:
        exit_now(rc)
    return rc


_RAN: list = []
"""Set (non-empty) once run() started a job in this process."""


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        command = launcher_command(args)
        p = plan(args) if command is None else None
    except LaunchError as e:
        sys.stderr.write(f"zerolite: error: {e}\n")
        return 2
    if command is not None:
        print(f"zerolite: running {args.user_script} with zerolite as deepspeed", flush=True)
        print(shlex.join(command["cmd"]), flush=True)
        return 0 if args.dry_run else run(command)
    where = f"node {p['node_rank']} of {p['nnodes']}"
    kind = "GPU" if p["gpus"] > 0 else "CPU (gloo)"
    print(f"zerolite: {where}, {p['nproc']} {kind} process(es) per node", flush=True)
    if p["nnodes"] > 1:
        print(f"zerolite: multi-node: run this same zerolite command on every node "
              f"({', '.join(p['hosts'])}); zerolite does not ssh", flush=True)
    print(format_command(p), flush=True)
    if args.dry_run:
        return 0
    return run(p)
