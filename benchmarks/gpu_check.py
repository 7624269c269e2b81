"""`make gpu-check`: prove the CUDA path in one run on one GPU (within ~9 minutes).

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check] [--deadline 540]
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check   # on CPU, before a GPU run

Phases, each in its own process under its own time limit (and the run's --deadline), all
writing under --out, in this order (the headline figures first):
  1. kernels   GB/s of int8/int4 quantize / dequantize / fused dequantize-sum and of the
               top-k selection kernel against the device's copy bandwidth (kernels.json;
               benchmarks/kernel_bandwidth.py)
  2. peers     a ~1.3B GPT at world 1: plain PyTorch, FSDP2, DeepSpeed (when importable),
               zerolite and zerolite + offload_optimizer cpu: tokens/s, MFU, peak memory,
               step-1 time, losses (peers.json; benchmarks/gpu_peers.py)
  3. tests     the `cuda` tests + the kernel tests (compiled on CUDA) + the device layer
               (tests.txt, junit.xml)
  4. prefetch  prefetch off vs on step times, exposed all-gather, one step's torch.profiler
               trace and the timeline PNG (prefetch*.json/png; benchmarks/gpu_prefetch.py)
  5. offload   offload_optimizer / offload_param "cpu" vs none: peak device memory and
               step time (offload_cpu.json; benchmarks/gpu_offload_cpu.py)
summary.json (env, phases [{name, rc, seconds}], each phase's figures) and summary.md are
rewritten after every phase, so a run cut short still leaves them. --archive also packs the
whole folder into one .tar.gz (the GPU machine returns at most 8 files).
--dry-run runs every phase on the CPU: peers with a tiny model and every engine it can,
the tests phase as a collection (import errors), the other scripts up to their "needs a
CUDA device" exit. Without CUDA and without --dry-run it says so and exits 0. Exit code 1
when a phase failed or ran out of time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEST_FILES = ["tests/test_cuda_path.py", "tests/test_device_layer.py",
              "tests/test_quant_kernels.py", "tests/test_topk_kernels.py",
              "tests/test_adamw_kernels.py",
              "tests/test_offload_cpu.py::test_cpu_offload_on_cuda_matches_no_offload",
              "tests/test_compat_lightning.py::test_lightning_deepspeed_strategy_on_gpu",
              "tests/test_compat_fabric.py::test_fabric_deepspeed_strategy_on_gpu",
              "tests/test_torch_autocast.py::test_on_cuda_the_programs_autocast_gives_way"]
"""The `cuda`-marked tests (every one: `pytest -m cuda --collect-only` lists them) and the
kernel tests, which compile on CUDA; the rest of the suite runs on CPU in CI."""


def phases(out: str, dry: bool) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit s), in run order; the run's deadline cuts the last ones."""
    py = sys.executable
    tests = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
             f"--junitxml={out}/junit.xml", *TEST_FILES]
    peers = [py, "benchmarks/gpu_peers.py", "--out", f"{out}/peers.json"]
    if dry:
        tests.append("--collect-only")
        peers.append("--dry-run")
    elif importlib.util.find_spec("xdist"):
        tests += ["-n", "4"]
    return [
        ("kernels", [py, "benchmarks/kernel_bandwidth.py", "--out", f"{out}/kernels.json"], 45),
        ("peers", peers, 240),
        ("tests", tests, 180),
        ("prefetch", [py, "benchmarks/gpu_prefetch.py", "--out", f"{out}/prefetch"], 90),
        ("offload", [py, "benchmarks/gpu_offload_cpu.py", "--out", f"{out}/offload_cpu.json"],
         60),
    ]


DEADLINE_S = 540.0
"""The whole run's default limit: a GPU task has 15 minutes of device time in all, the
machine's start included, and a rerun of a failed phase must still fit."""

FIGURES = {"kernels": "kernels.json", "peers": "peers.json", "prefetch": "prefetch.json",
           "offload": "offload_cpu.json"}


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "host": platform.node()}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001 - recorded, the tests phase will fail on it
        env["triton"] = f"unavailable: {exc!r}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, devices=torch.cuda.device_count(),
                   memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}")
    return env


def run_phase(name: str, cmd: list[str], limit_s: int, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    start = time.monotonic()
    log_path = os.path.join(out, f"{name}.txt")
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(log_path) as f:
        tail = f.read()[-3000:]
    return {"phase": name, "rc": rc, "seconds": round(time.monotonic() - start, 1),
            "log": os.path.relpath(log_path, out), "tail": tail}


def write_summary(env: dict, results: list[dict], out: str) -> str:
    """summary.json (env, phases, each phase's figures) and summary.md; returns the md."""
    figures = {}
    for r in results:
        path = os.path.join(out, FIGURES.get(r["phase"], ""))
        if r["phase"] in FIGURES and os.path.exists(path):
            with open(path) as f:
                figures[r["phase"]] = json.load(f)
    phases_ = [{"name": r["phase"], "rc": r["rc"], "seconds": r["seconds"]} for r in results]
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"env": env, "phases": phases_, "figures": figures}, f, indent=1)
    text = summary(env, results)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    return text


def summary(env: dict, results: list[dict]) -> str:
    lines = ["# gpu-check", "", "```", json.dumps(env, indent=1), "```", "",
             "| phase | result | seconds |", "|---|---|---|"]
    for r in results:
        ok = "ok" if r["rc"] == 0 else f"FAILED ({r['rc']})"
        lines.append(f"| {r['phase']} | {ok} | {r['seconds']} |")
    for r in results:
        lines += ["", f"## {r['phase']} (tail of {r['log']})", "", "```", r["tail"].strip(),
                  "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "gpu_check"))
    p.add_argument("--only", default="", help="comma-separated phases (default: all)")
    p.add_argument("--deadline", type=float, default=DEADLINE_S,
                   help="seconds for the whole run; later phases get what is left")
    p.add_argument("--archive", help="also pack --out into this .tar.gz at the end")
    p.add_argument("--dry-run", action="store_true", help="every phase on CPU, tiny sizes")
    args = p.parse_args(argv)
    start = time.monotonic()
    if not torch.cuda.is_available() and not args.dry_run:
        print("gpu-check needs a CUDA GPU and found none (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda}); nothing was run.")
        return 0
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = environment()
    wanted = {s for s in args.only.split(",") if s}
    results = []
    text = ""
    for name, cmd, limit in phases(out, args.dry_run):
        if wanted and name not in wanted:
            continue
        left = int(args.deadline - (time.monotonic() - start))
        if left < 10:
            results.append({"phase": name, "rc": "not run: deadline", "seconds": 0,
                            "log": "-", "tail": ""})
        else:
            limit = min(limit, left)
            print(f"gpu-check: {name} (limit {limit}s) ...", flush=True)
            results.append(run_phase(name, cmd, limit, out))
        print(f"gpu-check: {name}: rc={results[-1]['rc']} in {results[-1]['seconds']}s",
              flush=True)
        text = write_summary(env, results, out)
    print(text)
    if args.archive:
        import tarfile

        with tarfile.open(args.archive, "w:gz") as tar:
            tar.add(out, arcname=os.path.basename(out))
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
