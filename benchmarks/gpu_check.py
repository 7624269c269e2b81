"""`make gpu-check`: prove the CUDA path in one run on one GPU (within ~9 minutes).

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check]

Phases, each in its own process under its own time limit, all writing under --out:
  1. tests     the `cuda` tests + the kernel tests (compiled on CUDA) + the device layer
               (pytest.txt, junit.xml)
  2. kernels   GB/s of int8/int4 quantize / dequantize / fused dequantize-sum against the
               device's copy bandwidth (kernels.json; benchmarks/kernel_bandwidth.py)
  3. prefetch  prefetch off vs on step times, exposed all-gather, one step's torch.profiler
               trace and the timeline PNG (prefetch*.json/png; benchmarks/gpu_prefetch.py)
  4. offload   offload_optimizer / offload_param "cpu" vs none: peak device memory and
               step time (offload_cpu.json; benchmarks/gpu_offload_cpu.py); its cuda parity
               tests (tests/test_offload_cpu.py) run in phase 1
Then summary.md (environment, phase outcomes, the two tables). Without CUDA it prints that
it needs a GPU and exits 0. Exit code 1 when a phase failed or ran out of time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEST_FILES = ["tests/test_cuda_path.py", "tests/test_device_layer.py",
              "tests/test_quant_kernels.py", "tests/test_device_placement.py",
              "tests/test_harness_modes.py", "tests/test_streamed_comm.py",
              "tests/test_step_timers.py", "tests/test_offload_cpu.py"]


def phases(out: str) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit s): 240 + 60 + 150 + 60 s = 8.5 min at most."""
    py = sys.executable
    return [
        ("tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                   f"--junitxml={out}/junit.xml", *TEST_FILES], 240),
        ("kernels", [py, "benchmarks/kernel_bandwidth.py", "--out", f"{out}/kernels.json"], 60),
        ("prefetch", [py, "benchmarks/gpu_prefetch.py", "--out", f"{out}/prefetch"], 150),
        ("offload", [py, "benchmarks/gpu_offload_cpu.py", "--out", f"{out}/offload_cpu.json"],
         60),
    ]


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


def summary(env: dict, results: list[dict], out: str) -> str:
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
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check needs a CUDA GPU and found none (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda}); nothing was run.")
        return 0
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = environment()
    wanted = {s for s in args.only.split(",") if s}
    results = []
    for name, cmd, limit in phases(out):
        if wanted and name not in wanted:
            continue
        print(f"gpu-check: {name} (limit {limit}s) ...", flush=True)
        results.append(run_phase(name, cmd, limit, out))
        print(f"gpu-check: {name}: rc={results[-1]['rc']} in {results[-1]['seconds']}s",
              flush=True)
    text = summary(env, results, out)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
