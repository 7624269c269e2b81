"""Run every (size, dtype, world, engine) in its own torchrun job plus one single-process
reference per (size, dtype); write benchmarks/results/peers.{json,md,png}.

python -m benchmarks.peers.run [--sizes 20M,80M] [--worlds 2] [--dtypes fp32]
    [--engines zerolite3,zerolite2,fsdp2,ddp,deepspeed] [--steps 6] [--warmup 2]
DeepSpeed is optional (`pip install deepspeed`): skipped with a message when it does not
import in the workers' environment.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peers import workload as W
from benchmarks.peers.engines import ENGINES
from benchmarks.peers.png import bar_chart

REPO = Path(__file__).resolve().parents[2]
COLORS = {"zerolite3": (31, 119, 180), "zerolite2": (114, 177, 230), "fsdp2": (255, 127, 14),
          "ddp": (44, 160, 44), "deepspeed": (214, 39, 40)}


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH")] if p)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("DS_BUILD_OPS", "0")
    env.setdefault("ZEROLITE_TIMEOUT", "600")
    return env


def deepspeed_available() -> tuple[bool, str]:
    r = subprocess.run([sys.executable, "-c", "import deepspeed; print(deepspeed.__version__)"],
                       env=child_env(), capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        return True, r.stdout.strip()
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    return False, f"deepspeed does not import ({last}); `pip install deepspeed` to include it"


def _run(cmd: list[str], timeout: float, log: Path) -> tuple[bool, str]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            r = subprocess.run(cmd, env=child_env(), cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f} s (log {log})"
    if r.returncode != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        return False, f"exit {r.returncode}: " + " | ".join(tail)
    return True, f"{time.perf_counter() - t0:.1f} s"


def run_reference(size: str, dtype: str, steps: int, tmp: Path, timeout: float) -> dict:
    n = min(steps, W.SIZES[size].ref_steps or steps)
    out = tmp / f"ref_{size}_{dtype}.json"
    ok, msg = _run([sys.executable, "-m", "benchmarks.peers.reference", "--size", size,
                    "--dtype", dtype, "--steps", str(n), "--out", str(out)], timeout,
                   tmp / f"ref_{size}_{dtype}.log")
    if not ok:
        return {"size": size, "dtype": dtype, "losses": [], "error": msg}
    ref = json.loads(out.read_text())
    if n < steps:
        ref["note"] = f"reference computed for the first {n} of {steps} steps only (size)"
    return ref


def run_engine(engine, size, dtype, world, steps, warmup, tmp: Path, timeout: float) -> dict:
    out = tmp / f"{engine}_{size}_{dtype}_w{world}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(world), "-m", "benchmarks.peers.worker", "--engine", engine, "--size", size,
           "--dtype", dtype, "--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
    ok, msg = _run(cmd, timeout, out.with_suffix(".log"))
    if not ok:
        return {"engine": engine, "size": size, "dtype": dtype, "world": world,
                "status": "failed", "reason": msg}
    res = json.loads(out.read_text())
    res.update(status="ok", wall_s=float(msg.split()[0]))
    return res


def compare(results: list[dict], refs: dict) -> None:
    by_key = {(r["engine"], r["size"], r["dtype"], r["world"]): r for r in results
              if r["status"] == "ok"}
    for r in results:
        if r["status"] != "ok":
            continue
        ref = refs.get((r["size"], r["dtype"]), {}).get("losses") or []
        n = min(len(ref), len(r["losses"]))
        r["ref_steps_compared"] = n
        r["max_abs_dloss"] = max((abs(a - b) for a, b in zip(r["losses"], ref)), default=None)
        r["max_rel_dloss"] = max((abs(a - b) / abs(b) for a, b in zip(r["losses"], ref)),
                                 default=None)
        for base in ("ddp", "zerolite3"):
            other = by_key.get((base, r["size"], r["dtype"], r["world"]))
            r[f"time_vs_{base}"] = r["median_step_s"] / other["median_step_s"] if other else None
            r[f"mem_vs_{base}"] = r["peak_rss_mib"] / other["peak_rss_mib"] if other else None
            r[f"max_abs_dloss_vs_{base}"] = (max(abs(a - b) for a, b in
                                                 zip(r["losses"], other["losses"]))
                                             if other else None)


def _f(v, fmt="{:.3f}"):
    return "n/a" if v is None else fmt.format(v)


def write_markdown(path: Path, report: dict, groups: list[tuple], engines: list[str]) -> None:
    m = report["machine"]
    lines = ["# zerolite vs peers (CPU, gloo)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB; torch {m['torch']}, "
             f"Python {m['python']}. Steps: {report['settings']['steps']} timed after "
             f"{report['settings']['warmup']} warm-up; GPT seq_len {W.SEQ_LEN}, AdamW lr {W.LR}, "
             f"clip {W.CLIP} (fp64 norm in every engine).", "",
             "| engine | size | dtype | world | median step s | samples/s | peak RSS MiB/rank "
             "| CPU s/step | load | exposed comm s | max \\|Δloss\\| vs ref | time ×DDP | mem ×DDP | time ×zl3 "
             "| mem ×zl3 |", "|" + "---|" * 15]
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(f"| {r['engine']} | {r['size']} | {r['dtype']} | {r['world']} | "
                         f"{r['status']}: {r['reason']} |" + " |" * 10)
            continue
        lines.append(
            f"| {r['engine']} | {r['size']} | {r['dtype']} | {r['world']} | "
            f"{r['median_step_s']:.3f} | {r['samples_per_s']:.2f} | {r['peak_rss_mib']:.0f} | "
            f"{_f(r.get('cpu_s_per_step'))} | "
            f"{_f((r.get('loadavg_1m_before_after') or [None])[0], '{:.1f}')} | "
            f"{_f(r['exposed_comm_s'])} | {_f(r['max_abs_dloss'], '{:.2e}')} "
            f"({r['ref_steps_compared']} steps) | {_f(r['time_vs_ddp'], '{:.2f}')} | "
            f"{_f(r['mem_vs_ddp'], '{:.2f}')} | {_f(r['time_vs_zerolite3'], '{:.2f}')} | "
            f"{_f(r['mem_vs_zerolite3'], '{:.2f}')} |")
    lines += ["", "Peak RSS: psutil-sampled (10 ms) maximum per rank during the steps, "
              "slowest rank reported; every rank first builds the full fp32 model (same seed), "
              "so init memory is included. Exposed comm: zerolite's StepStats "
              "(all_gather_wait_s + reduce_scatter_wait_s, slowest rank, median); n/a where the "
              "engine does not expose it. CPU s/step: process CPU time (all threads) of the "
              "busiest rank per step, median; less sensitive than wall time to other load on "
              "the machine. load: 1-minute load average when the job started (2 cores: "
              "above ~2.5 means other processes competed for the CPUs).", "",
              "## peers.png", "",
              "Top: median step s; bottom: peak RSS MiB/rank. Groups (numbered under the bars):",
              ""]
    lines += [f"{i + 1}. {s} {d} world {w}" for i, (s, d, w) in enumerate(groups)]
    lines += ["", "Bar colours, left to right: " + ", ".join(
        f"{e} #{''.join(f'{c:02x}' for c in COLORS[e])}" for e in engines), ""]
    if report["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in report["notes"]] + [""]
    lines += ["## Per-step losses (mean over ranks)", ""]
    for (s, d, w) in groups:
        ref = report["references"].get(f"{s}/{d}", {}).get("losses", [])
        lines.append(f"- {s} {d} world {w}: reference " + ", ".join(f"{v:.6f}" for v in ref))
        for r in report["results"]:
            if (r["size"], r["dtype"], r["world"]) == (s, d, w) and r["status"] == "ok":
                lines.append(f"  - {r['engine']}: " + ", ".join(f"{v:.6f}" for v in r["losses"]))
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20M,80M")
    ap.add_argument("--worlds", default="2")
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--name", default="peers", help="output file stem")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    args = ap.parse_args(argv)
    sizes, dtypes = args.sizes.split(","), args.dtypes.split(",")
    worlds = [int(w) for w in args.worlds.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e}; choose from {','.join(ENGINES)}")
    for s in sizes:
        if s not in W.SIZES:
            ap.error(f"unknown size {s}; choose from {','.join(W.SIZES)}")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    notes, skipped = [], {}
    if "deepspeed" in engines:
        ok, msg = deepspeed_available()
        if ok:
            notes.append(f"deepspeed {msg}: ZeRO-3, torch_adam, DS_ACCELERATOR=cpu, gloo")
        else:
            skipped["deepspeed"] = msg
            notes.append(f"deepspeed skipped: {msg}")
            print(f"[peers] deepspeed skipped: {msg}", flush=True)
    if "bf16" in dtypes and "ddp" in engines:
        notes.append("ddp bf16 = fp32 params under torch.autocast('cpu', bfloat16); zerolite "
                     "and fsdp2 keep bf16 compute copies of the params (fp32 masters/reduce); "
                     "the bf16 reference uses autocast, so bf16 Δloss is rounding, ~1e-2")
    settings = {"sizes": sizes, "worlds": worlds, "dtypes": dtypes, "engines": engines,
                "steps": args.steps, "warmup": args.warmup}
    results, refs = [], {}
    with tempfile.TemporaryDirectory(prefix="peers_") as tmpd:
        tmp = Path(tmpd)
        for size in sizes:
            for dtype in dtypes:
                t0 = time.perf_counter()
                refs[(size, dtype)] = run_reference(size, dtype, args.steps + args.warmup, tmp,
                                                    args.timeout)
                print(f"[peers] reference {size} {dtype}: {time.perf_counter() - t0:.1f} s",
                      flush=True)
                for world in worlds:
                    if W.SIZES[size].global_batch % world:
                        notes.append(f"{size} world {world} skipped: global batch "
                                     f"{W.SIZES[size].global_batch} not divisible")
                        continue
                    for engine in engines:
                        if engine in skipped:
                            results.append({"engine": engine, "size": size, "dtype": dtype,
                                            "world": world, "status": "skipped",
                                            "reason": skipped[engine]})
                            continue
                        r = run_engine(engine, size, dtype, world, args.steps, args.warmup, tmp,
                                       args.timeout)
                        results.append(r)
                        print(f"[peers] {engine} {size} {dtype} w{world}: " +
                              (f"{r['median_step_s']:.3f} s/step, {r['peak_rss_mib']:.0f} MiB"
                               if r["status"] == "ok" else r["reason"]), flush=True)
    compare(results, refs)
    for (s, d), ref in refs.items():
        if ref.get("note"):
            notes.append(f"{s} {d}: {ref['note']}")
        if ref.get("error"):
            notes.append(f"{s} {d}: reference failed: {ref['error']}")
    report = {"machine": W.machine_info(), "settings": settings,
              "sizes": {s: W.size_info(W.SIZES[s]) for s in sizes},
              "references": {f"{s}/{d}": r for (s, d), r in refs.items()},
              "results": results, "notes": notes}
    (out_dir / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    groups = [(s, d, w) for s in sizes for d in dtypes for w in worlds]
    shown = [e for e in engines if e not in skipped]

    def value(key, g, e):
        for r in results:
            if (r["engine"], r["size"], r["dtype"], r["world"]) == (e, *g) and r["status"] == "ok":
                return r[key]
        return None

    panels = [[[value(k, g, e) for e in shown] for g in groups]
              for k in ("median_step_s", "peak_rss_mib")]
    bar_chart(str(out_dir / f"{args.name}.png"), groups, shown, panels, COLORS)
    write_markdown(out_dir / f"{args.name}.md", report, groups, shown)
    print(f"[peers] wrote {out_dir / args.name}.{{json,md,png}}", flush=True)
    return report


if __name__ == "__main__":
    main()
