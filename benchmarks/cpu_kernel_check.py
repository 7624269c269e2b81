"""Which CPU kernels bf16 matmuls use, natively and with the AVX2 override (issue 24).

    PYTHONPATH=. python -m benchmarks.cpu_kernel_check [--pytest]

The bf16 tests must pass on any x86-64 CPU torch supports, not only on AVX-512-BF16 machines.
On an AVX-512 machine `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` is meant to bring the
AVX2 paths back; this checks that it does: torch's reported CPU capability, the oneDNN primitive
each bf16 matmul/linear runs (DNNL_VERBOSE; none = ATen's own kernel) and the bits of their
results, in a fresh process with and without the override. --pytest then runs the bf16 tests
(`-k "bf16 or bfloat16 or tutorial or bf16_reference"`) under the override.
Result: benchmarks/results/cpu_kernel_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
PROBE = """
import json, torch
torch.manual_seed(0)
a, b = torch.randn(256, 256).bfloat16(), torch.randn(256, 256).bfloat16()
lin = torch.nn.Linear(256, 256).bfloat16()
print("RESULT " + json.dumps({"cpu_capability": torch.backends.cpu.get_cpu_capability(),
      "torch": torch.__version__, "matmul_sum": (a @ b).float().sum().item(),
      "linear_sum": lin(a).float().sum().item()}))
"""


def probe(extra: dict) -> dict:
    env = dict(os.environ, DNNL_VERBOSE="1", **extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    res["onednn_bf16_primitives"] = re.findall(r"primitive,exec,cpu,(\w+),([\w:]+),", out)
    res["env"] = extra
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pytest", action="store_true", help="run the bf16 tests under the override")
    a = p.parse_args(argv)
    with open("/proc/cpuinfo") as f:
        flags = sorted(set(re.findall(r"\bavx512[a-z_0-9]*|\bavx2\b|\bamx[a-z_0-9]*", f.read())))
    result = {"cpu_flags": flags, "native": probe({}), "avx2_override": probe(AVX2)}
    if a.pytest:
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "tests/", "-k",
               "bf16 or bfloat16 or tutorial or bf16_reference"]
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **AVX2), capture_output=True,
                              text=True)
        result["pytest_under_override"] = {"command": " ".join(cmd[1:]), "rc": proc.returncode,
                                           "summary": proc.stdout.strip().splitlines()[-1]}
    with open(os.path.join(ROOT, "benchmarks", "results", "cpu_kernel_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
