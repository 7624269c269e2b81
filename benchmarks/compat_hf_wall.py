"""Wall time of the HF Trainer script (tests/compat_scripts/hf_trainer_gpt2.py: GPT-2 2x64,
6 steps, evaluate, save_model, resume) under zerolite as DeepSpeed (world 2), next to the same
script on one process without DeepSpeed and, when a Python with the real DeepSpeed is given,
under DeepSpeed itself. Each engine runs as its users run it (torchrun; nothing zerolite needs
is applied to the others). Writes benchmarks/results/compat_hf_wall.json.

    PYTHONPATH=. python benchmarks/compat_hf_wall.py --repeats 3 [--deepspeed-python /venv-ds/bin/python]

Whole-process wall times include Python/torch/transformers start-up (several seconds each);
on a shared machine they are noisy: compare the medians of one run, not across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "hf_trainer_gpt2.py")
CONFIG = os.path.join(ROOT, "tests", "compat_scripts", "hf_ds_config_zero3_auto.json")
OUT = os.path.join(ROOT, "benchmarks", "results", "compat_hf_wall.json")


def _init(path: str) -> None:
    code = ("import sys, torch, transformers as t; torch.manual_seed(0); "
            "t.GPT2LMHeadModel(t.GPT2Config(vocab_size=128, n_positions=16, n_embd=64, n_layer=2, "
            "n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, "
            "eos_token_id=0)).save_pretrained(sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, path], check=True, capture_output=True)


def _time(cmd: list[str], env: dict) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    return time.perf_counter() - start, proc.returncode, (proc.stdout + proc.stderr)[-400:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--deepspeed-python", default=None,
                   help="a Python whose site-packages has the real DeepSpeed")
    a = p.parse_args()
    base = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", ZEROLITE_TIMEOUT="120")
    runs: dict[str, list] = {"single_process_no_deepspeed": [], "zerolite_as_deepspeed": []}
    if a.deepspeed_python:
        runs["real_deepspeed"] = []
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        _init(init)
        common = ["--init", init, "--steps", "6", "--gas", "2", "--save_steps", "3"]
        for i in range(a.repeats):
            for name in runs:
                out = os.path.join(tmp, f"{name}-{i}")
                if name == "single_process_no_deepspeed":
                    cmd, env = [sys.executable, SCRIPT, "--per_device", "4"], dict(base, PYTHONPATH=ROOT)
                else:
                    py = sys.executable if name == "zerolite_as_deepspeed" else a.deepspeed_python
                    alias = ["-m", "zerolite.as_deepspeed"] if name == "zerolite_as_deepspeed" else []
                    cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *alias, SCRIPT, "--per_device", "2", "--deepspeed", CONFIG]
                    # the real DeepSpeed's Python borrows transformers/accelerate from ours
                    extra = ROOT if name == "zerolite_as_deepspeed" else os.pathsep.join(
                        p for p in sys.path if p.endswith("site-packages"))
                    env = dict(base, PYTHONPATH=extra)
                wall, rc, tail = _time([*cmd, "--out", out, *common], env)
                runs[name].append({"wall_s": round(wall, 2), "rc": rc,
                                   **({} if rc == 0 else {"error_tail": tail})})
                print(f"{name} #{i}: {wall:.1f}s rc={rc}", flush=True)
    summary = {name: statistics.median(r["wall_s"] for r in rs if r["rc"] == 0)
               if any(r["rc"] == 0 for r in rs) else None for name, rs in runs.items()}
    with open(OUT, "w") as f:
        json.dump({"runs": runs, "median_wall_s": summary, "cpus": os.cpu_count(),
                   "load_avg_at_end": os.getloadavg()}, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
