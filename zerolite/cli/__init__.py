"""The `zerolite` command.

    zerolite [launch] [launcher flags] script.py [script args]   start training (torchrun)
    zerolite check-config CONFIG.json --world-size N [--params P | --model mod:factory]
    zerolite report                                               environment for bug reports
    zerolite consolidate ...                                      merge per-rank checkpoints
    zerolite plan --params P --gpus N [...]                       step-time model (comm vs compute)

Without a subcommand the arguments go to `launch`, as with DeepSpeed's `deepspeed` command.
Subcommands import their dependencies lazily so that `zerolite --help` stays fast.
"""
from __future__ import annotations

import sys

USAGE = __doc__.split("\n\n")[1]
SUBCOMMANDS = ("launch", "check-config", "report", "consolidate", "plan")


def main(argv: list[str] | None = None) -> int:
    process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage:\n" + USAGE)
        print("\n`zerolite <subcommand> --help` shows a subcommand's options.")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        command, rest = "launch", argv
    if command == "launch":
        from zerolite.cli.launch import main as launch

        def run(rest):  # the `zerolite` command itself (argv from sys.argv): exit at once
            return launch(rest, exit_process=process)  # after a job (launch.exit_now)
    elif command == "check-config":
        from zerolite.cli.check_config import main as run
    elif command == "report":
        from zerolite.cli.report import main as run
    elif command == "plan":
        from zerolite.cli.plan import main as run
    else:
        run = _consolidate
    try:
        return run(rest)
    except KeyboardInterrupt:
        return 130


def _consolidate(argv: list[str]) -> int:
    try:
        from zerolite.checkpoint.consolidate import main as consolidate
    except ImportError as e:
        sys.stderr.write(f"zerolite consolidate: error: not available in this install ({e})\n")
        return 2
    rc = consolidate(argv)
    return 0 if rc is None else int(rc)


__all__ = ["main"]
