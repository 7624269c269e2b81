"""Run a program written for DeepSpeed with `deepspeed` meaning zerolite.

    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed train.py --deepspeed_config ds.json
    python -m zerolite.as_deepspeed -m zerolite.cli report     # which deepspeed is imported

Options before the script: `--pass_local_rank` appends `--local_rank=$LOCAL_RANK` to the
script's arguments, as DeepSpeed's launcher does (`zerolite --as-deepspeed` passes it unless
`--no_local_rank`). The alias (zerolite/compat/site first on sys.path and PYTHONPATH) holds in
this process and every process it starts.
"""
from __future__ import annotations

import os
import runpy
import sys

from zerolite.compat import SITE_DIR, alias_env

USAGE = ("usage: python -m zerolite.as_deepspeed [--pass_local_rank] "
         "(SCRIPT.py | -m MODULE) [ARGS...]")


def main(argv: list[str]) -> None:
    pass_local_rank = False
    while argv and argv[0] == "--pass_local_rank":
        pass_local_rank = True
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write(USAGE + "\n")
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    for key, value in alias_env(dict(os.environ)).items():
        os.environ[key] = value
    if pass_local_rank:
        argv = [*argv, f"--local_rank={os.environ.get('LOCAL_RANK', '0')}"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[:1] = [os.getcwd(), SITE_DIR]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.isfile(script):
        sys.stderr.write(f"zerolite.as_deepspeed: error: script {script!r} not found\n")
        sys.exit(2)
    sys.argv = list(argv)
    # As `python script.py`: the script's folder first; then the alias, before site-packages.
    sys.path[:1] = [os.path.dirname(os.path.abspath(script)), SITE_DIR]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
