"""Record what real DeepSpeed does in the conformance client (tests/compat_scripts/
ds_conformance.py) into tests/ds_golden/ds_conformance.json, which tests/test_ds_conformance.py
holds zerolite to.

    python tools/ds_golden.py --python PY [--pythonpath DIR]

PY is an interpreter with torch (the CPU build) that imports DeepSpeed 0.19.8, directly or
through --pythonpath (e.g. the pure-Python wheel in ../shared/gpu-wheels/ and its
dependencies installed with `pip install --target DIR`). DeepSpeed runs on its CPU
accelerator with gloo at world 2, as the test runs zerolite. Nothing here imports DeepSpeed
itself, so the tool runs from the project's own venv.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "ds_conformance.py")
GOLDEN = os.path.join(ROOT, "tests", "ds_golden", "ds_conformance.json")
WORLD = 2


def record(python: str, pythonpath: str | None, out: str) -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(WORLD), SCRIPT, "--out", out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"ds_golden: the conformance client failed under DeepSpeed "
                 f"(rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    ranks = []
    for r in range(WORLD):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    if not ranks[0].get("deepspeed_version", "").startswith("0.19"):
        sys.exit(f"ds_golden: expected DeepSpeed 0.19.x, got {ranks[0].get('deepspeed_version')}")
    # cpu_fp16: DeepSpeed's CPU accelerator check (mkldnn fp16, e.g. AVX512-FP16), on which
    # zero.Init's explicit dtype depends (test_ds_conformance.py, ZERO_INIT_DTYPE).
    versions = subprocess.run(
        [python, "-c", "import torch, sys; print(torch.__version__, sys.version.split()[0], "
         "bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()))"],
        env=env, capture_output=True, text=True).stdout.split()
    return {"recorded_with": {"deepspeed": ranks[0]["deepspeed_version"], "torch": versions[0],
                              "python": versions[1], "cpu_fp16": versions[2] == "True",
                              "machine": platform.machine(),
                              "accelerator": "cpu (DS_ACCELERATOR=cpu), gloo", "world": WORLD},
            "ranks": ranks}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", required=True, help="interpreter that imports DeepSpeed")
    p.add_argument("--pythonpath", default=None, help="PYTHONPATH for it (DeepSpeed's dir)")
    p.add_argument("--golden", default=GOLDEN)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        golden = record(args.python, args.pythonpath, tmp)
    os.makedirs(os.path.dirname(args.golden), exist_ok=True)
    with open(args.golden, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")
    names = sorted(k for k in golden["ranks"][0] if isinstance(golden["ranks"][0][k], dict))
    print(f"ds_golden: {len(names)} scenarios from DeepSpeed "
          f"{golden['recorded_with']['deepspeed']} -> {os.path.relpath(args.golden, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
