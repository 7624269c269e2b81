"""`deepspeed.launcher.launch` under the alias: DeepSpeed's per-node launcher (what its runner
starts on each node: `--world_info` names every node's slots), run by zerolite's launcher.

    python -m deepspeed.launcher.launch --world_info=B64 --node_rank=0 --master_addr=A \
        --master_port=P train.py ...
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys

from zerolite.cli.hostfile import LaunchError


def encode_world_info(world_info: dict) -> str:
    """{host: [slot, ...]} as DeepSpeed passes it (url-safe base64 of its JSON)."""
    return base64.urlsafe_b64encode(json.dumps(world_info).encode("utf-8")).decode("utf-8")


def decode_world_info(text: str) -> dict:
    try:
        world = json.loads(base64.urlsafe_b64decode(text))
    except ValueError:
        raise LaunchError(f"--world_info {text!r}: not base64 of a JSON object") from None
    if not isinstance(world, dict) or not world or not all(
            isinstance(s, list) and s and all(isinstance(i, int) for i in s)
            for s in world.values()):
        raise LaunchError(f"--world_info: expected {{host: [slot, ...]}}, got {world!r}")
    return world


def parse_args(args=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="deepspeed.launcher.launch")
    p.add_argument("--node_rank", type=int, default=0)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--world_info", default="None")
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--log_level", default="info")
    p.add_argument("--quiet", "-q", action="store_true")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p.parse_args(args=args)


def zerolite_argv(args: argparse.Namespace) -> tuple[list[str], dict]:
    """(`zerolite launch` arguments, extra environment) for this node."""
    world = decode_world_info(args.world_info)
    hosts = list(world)
    if not 0 <= args.node_rank < len(hosts):
        raise LaunchError(f"--node_rank {args.node_rank}: --world_info has {len(hosts)} node(s)")
    slots = world[hosts[args.node_rank]]
    env = {}
    if slots != list(range(len(slots))):  # as DeepSpeed: this node's slots are its devices
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slots))
    argv = ["--as-deepspeed", "--num_procs", str(len(slots)), "--num_nodes", str(len(hosts)),
            "--node_rank", str(args.node_rank), "--master_addr", args.master_addr,
            "--master_port", str(args.master_port)]
    argv += ["--module"] * args.module + ["--no_local_rank"] * args.no_local_rank
    return [*argv, args.training_script, *args.training_script_args], env


def main(args=None) -> None:
    from zerolite.cli.launch import main as launch

    try:
        argv, env = zerolite_argv(parse_args(args))
    except LaunchError as e:
        sys.stderr.write(f"deepspeed.launcher.launch (zerolite's alias): error: {e}\n")
        sys.exit(2)
    os.environ.update(env)
    rc = launch(argv)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
