"""`deepspeed.launcher.runner` under the alias: the `deepspeed` command (DeepSpeed's flags and
constants), run by zerolite's launcher.

    deepspeed --num_gpus 2 train.py --deepspeed_config ds.json   # zerolite/compat/bin/deepspeed
    python -m deepspeed.launcher.runner --num_gpus 2 train.py ...

One node: this node's ranks start here (torchrun), `import deepspeed` meaning zerolite in each.
Several nodes: as DeepSpeed's `--no_ssh`, the same command runs on every node with its
`--node_rank` (Accelerate: `--deepspeed_multinode_launcher nossh --machine_rank N`, or
`standard`, which is torchrun and never comes here). DeepSpeed's ssh / MPI / Slurm fan-out from
one node is refused with that advice: zerolite's launcher logs into no other host.
"""
from __future__ import annotations

import argparse
import os
import sys

from zerolite.cli.hostfile import LaunchError
from zerolite.compat.deepspeed.launcher.constants import (  # noqa: F401 - DeepSpeed's names
    IMPI_LAUNCHER, MPICH_LAUNCHER, MVAPICH_LAUNCHER, OPENMPI_LAUNCHER, PDSH_LAUNCHER,
    PDSH_MAX_FAN_OUT, SLURM_LAUNCHER,
)

DLTS_HOSTFILE = "/job/hostfile"
EXPORT_ENVS = ["MLFLOW", "PYTHON", "MV2", "UCX"]
DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")
DEEPSPEED_ENVIRONMENT_PATHS = [os.path.expanduser("~"), "."]
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500

_NOT_HERE = {  # DeepSpeed runner flags for features zerolite's launcher does not have
    "no_python": "running a non-Python executable per rank",
    "autotuning": "the autotuner",
    "force_multi": "the multi-node fan-out",
    "bind_cores_to_rank": "binding ranks to cores",
    "bind_core_list": "binding ranks to cores",
    "enable_each_rank_log": "per-rank log files",
    "save_pid": "the /tmp/<pid>.ds pid file",
    "venv_script": "the remote virtualenv script of the ssh fan-out",
}


def parse_args(args=None) -> argparse.Namespace:
    """DeepSpeed 0.19.8's runner flags."""
    p = argparse.ArgumentParser(prog="deepspeed", description="DeepSpeed's launcher (zerolite's "
                                "alias): starts this node's ranks with zerolite's launcher")
    p.add_argument("-H", "--hostfile", default=DLTS_HOSTFILE)
    p.add_argument("-i", "--include", default="")
    p.add_argument("-e", "--exclude", default="")
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=None,
                   help=f"default {TORCH_DISTRIBUTED_DEFAULT_PORT} with several nodes; one node "
                        "without it takes a free port")
    p.add_argument("--master_addr", default="")
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--launcher", default=PDSH_LAUNCHER)
    p.add_argument("--launcher_args", default="")
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--no_ssh", action="store_true")
    p.add_argument("--no_ssh_check", action="store_true")
    p.add_argument("--force_multi", action="store_true")
    p.add_argument("--save_pid", action="store_true")
    p.add_argument("--enable_each_rank_log", default="None")
    p.add_argument("--autotuning", default="", choices=["tune", "run"])
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    p.add_argument("--bind_cores_to_rank", action="store_true")
    p.add_argument("--bind_core_list", default=None)
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--venv_script", default=None)
    p.add_argument("--log_level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("-q", "--quiet", action="store_true")
    return p.parse_args(args=args)


def zerolite_argv(args: argparse.Namespace) -> list[str]:
    """The `zerolite launch` arguments that start what DeepSpeed's runner would on this node;
    raises LaunchError for what zerolite's launcher cannot do."""
    from zerolite.cli.launch import build_parser, plan

    defaults = parse_args(["x"])
    for flag, what in _NOT_HERE.items():
        if getattr(args, flag) != getattr(defaults, flag):
            raise LaunchError(f"--{flag}: {what} is not supported by zerolite's launcher")
    argv = ["--as-deepspeed"]
    if os.path.isfile(args.hostfile):
        argv += ["--hostfile", args.hostfile]
    elif args.hostfile != DLTS_HOSTFILE:
        sys.stderr.write(f"deepspeed: hostfile {args.hostfile!r} not found; training with local "
                         "resources only (as DeepSpeed)\n")
    for flag in ("include", "exclude", "master_addr"):
        if getattr(args, flag):
            argv += [f"--{flag}", getattr(args, flag)]
    for flag in ("num_nodes", "num_gpus", "node_rank"):
        if getattr(args, flag) != -1:
            argv += [f"--{flag}", str(getattr(args, flag))]
    if args.no_ssh and args.node_rank < 0:
        raise LaunchError("--no_ssh: each node needs its --node_rank (0 .. nodes-1)")
    argv += ["--module"] * args.module + ["--no_local_rank"] * args.no_local_rank
    probe = [*argv, *(["--node_rank", "0"] if args.node_rank < 0 else []), args.user_script]
    nnodes = plan(build_parser().parse_args(probe))["nnodes"]
    if nnodes > 1 and not args.no_ssh:
        raise LaunchError(
            f"{nnodes} nodes with --launcher {args.launcher}: zerolite's launcher logs into no "
            "other host; run the same command on every node with --no_ssh --node_rank N "
            "(Accelerate: --deepspeed_multinode_launcher nossh --machine_rank N, or standard)")
    if args.master_port is not None or nnodes > 1:
        port = TORCH_DISTRIBUTED_DEFAULT_PORT if args.master_port is None else args.master_port
        argv += ["--master_port", str(port)]
    return [*argv, args.user_script, *args.user_args]


def main(args=None) -> None:
    from zerolite.cli.launch import main as launch

    try:
        argv = zerolite_argv(parse_args(args))
    except LaunchError as e:
        sys.stderr.write(f"deepspeed (zerolite's alias): error: {e}\n")
        sys.exit(2)
    rc = launch(argv)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
