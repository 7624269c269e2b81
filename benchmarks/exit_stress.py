"""Exit codes of finished runs on a loaded machine (issue 24: a finished run exits 0, every time).

    PYTHONPATH=. python -m benchmarks.exit_stress [--two 40] [--one 20] [--load 2]
        [--script deepspeed|exit-modes] [--out exit_stress.json]

Runs jobs one after another while --load busy-loop processes eat the cores (on top of whatever
else the machine runs), each as users start them (tests/exit_cases.py, the helper of the slow
stress test tests/test_clean_exit.py::test_exit_stress):

- two-launchers: `zerolite --num_nodes 2 --node_rank 0|1 --num_procs 1 --master_addr 127.0.0.1
  --master_port P` (two nodes on loopback, one rank each);
- one-launcher: `zerolite --num_procs 2` (one node, two ranks).

--script deepspeed (default): examples/deepspeed_style_train.py (the DeepSpeed tutorial-style
script, `import zerolite as deepspeed`) with configs/zero3_cpu.json: ZeRO-3, fp32, world 2,
micro-batch 4, 24 samples = 3 optimizer steps, then save_checkpoint, shipped watchdog defaults.
--script exit-modes: tests/compat_scripts/exit_modes.py, cycling the endings of
exit_cases.ENDINGS (destroy_process_group or not, sys.exit(0) or not, one node finishing first).

A job counts as clean when every launcher exits 0 within --timeout-s (else "hang": stopped by
SIGTERM, then SIGKILL) and no rank printed libstdc++'s terminate line or died of SIGABRT.
Result: benchmarks/results/<--out> (every job's exit codes and seconds; the output of any job
that was not clean).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from exit_cases import ENDINGS, aborted, run_job  # noqa: E402

from benchmarks.cpu_load import busy_cores  # noqa: E402

OUT = os.path.join(ROOT, "benchmarks", "results")
DS_SCRIPT = os.path.join(ROOT, "examples", "deepspeed_style_train.py")
DS_ARGS = ("--deepspeed", "--deepspeed_config", os.path.join(ROOT, "configs", "zero3_cpu.json"),
           "--epochs", "1", "--num_samples", "24", "--log_interval", "1")


def one_job(kind: str, i: int, script: str, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="exit_stress_") as tmp:
        if script == "deepspeed":
            job = run_job(kind, *DS_ARGS, "--save_dir", os.path.join(tmp, "ckpt"), cwd=tmp,
                          script=DS_SCRIPT, timeout_s=timeout_s)
            finished = job.output.count("Finished training") == 1
            steps = job.output.count("] loss: ")
            saved = os.path.isfile(os.path.join(tmp, "ckpt", "latest"))
            ending = "return"
        else:
            ending = " ".join(ENDINGS[i % len(ENDINGS)])
            job = run_job(kind, *ENDINGS[i % len(ENDINGS)], timeout_s=timeout_s)
            finished = job.output.count("done (watchdog on)") == 2
            steps, saved = 3, None
    clean = job.ok and not aborted(job)
    rec = {"kind": kind, "i": i, "ending": ending, "rcs": job.rcs, "seconds": round(job.seconds, 1),
           "clean": clean, "aborted": aborted(job), "finished_training": finished,
           "steps_logged": steps, "checkpoint_saved": saved}
    if not clean or not finished:
        rec["output_tail"] = job.output[-8000:]
    return rec


def summarize(jobs: list[dict], kind: str) -> dict:
    mine = [j for j in jobs if j["kind"] == kind]
    rcs = [str(rc) for j in mine for rc in j["rcs"]]
    return {"jobs": len(mine), "jobs_all_exit_0": sum(j["clean"] for j in mine),
            "launcher_exit_codes": {str(rc): rcs.count(rc) for rc in sorted(set(rcs))},
            "hangs": sum("hang" in j["rcs"] for j in mine),
            "aborts": sum(j["aborted"] for j in mine),
            "finished_training": sum(j["finished_training"] for j in mine),
            "seconds": {"min": min((j["seconds"] for j in mine), default=0),
                        "max": max((j["seconds"] for j in mine), default=0)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--two", type=int, default=40, help="two-launcher loopback jobs")
    p.add_argument("--one", type=int, default=20, help="one-node 2-process jobs")
    p.add_argument("--load", type=int, default=2, help="busy-loop processes beside the jobs")
    p.add_argument("--script", default="deepspeed", choices=("deepspeed", "exit-modes"))
    p.add_argument("--timeout-s", type=float, default=150.0, help="a job still running = hang")
    p.add_argument("--out", default="exit_stress.json")
    a = p.parse_args(argv)
    # two two-launcher jobs, then one one-launcher job, ...: both kinds see the same load
    two, one = ["two-launchers"] * a.two, ["one-launcher"] * a.one
    order = []
    while two or one:
        if two:
            order.append(two.pop())
        if two:
            order.append(two.pop())
        if one:
            order.append(one.pop())
    jobs, start = [], time.monotonic()
    with busy_cores(a.load) as load:
        load.sample()
        for i, kind in enumerate(order):
            rec = one_job(kind, i, a.script, a.timeout_s)
            rec["load_avg_1m"] = load.sample()
            jobs.append(rec)
            print(f"{i:3d} {kind:13s} rcs {rec['rcs']} {rec['seconds']:5.1f}s load "
                  f"{rec['load_avg_1m']:.1f}{'' if rec['clean'] else '  NOT CLEAN'}"
                  f"{'' if rec['finished_training'] else '  NOT FINISHED'}", flush=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {"script": a.script, "commit": commit, "timeout_s": a.timeout_s,
              "wall_s": round(time.monotonic() - start), **load.summary(),
              "summary": {k: summarize(jobs, k) for k in ("two-launchers", "one-launcher")},
              "jobs": jobs}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, a.out), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["summary"], indent=1))
    return 0 if all(j["clean"] and j["finished_training"] for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
