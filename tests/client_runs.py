"""Running a client program (tests/compat_scripts/) as its users do, for the acceptance tests:
on one plain process (the reference), or on ranks under torchrun with `deepspeed` meaning
zerolite. Each run writes rank{r}.json records into its own folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "compat_scripts")


def run_client(script: str, out, *args: str, ranks: int = 0) -> list[dict]:
    """`script` (a file in compat_scripts) with `--out out` and `args`: one plain process when
    ranks=0, else `ranks` ranks under torchrun -m zerolite.as_deepspeed; every rank's record."""
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60")
    launch = [sys.executable]
    if ranks:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(ranks), "-m", "zerolite.as_deepspeed"]
    proc = subprocess.run(launch + [os.path.join(SCRIPTS, script), "--out", str(out), *args],
                          cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(max(ranks, 1))]


def as_tensors(state: dict) -> dict[str, torch.Tensor]:
    """A recorded state dict (lists) as tensors."""
    return {k: torch.tensor(v) for k, v in state.items()}


def reference_and_gpu_run(script: str, tmp_path) -> tuple[dict, dict]:
    """The reference (one CPU process, world 1) and the script on one GPU rank at stage 3,
    as its users run it there; both records."""
    (ref,) = run_client(script, tmp_path / "ref", "--world", "1")
    (rank,) = run_client(script, tmp_path / "ds", "--stage", "3", "--world", "1", ranks=1)
    assert rank["engine"] == "ZeroEngine" and "zerolite" in rank["deepspeed"]
    return ref, rank
