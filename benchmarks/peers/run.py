"""Run every cell (size, dtype, world, config, accumulation) x engine in its own torchrun
job plus one single-process reference per (size, dtype); write
benchmarks/results/<name>.{json,md,png}.

python -m benchmarks.peers.run [--sizes 20M,80M] [--worlds 2] [--dtypes fp32]
    [--configs tuned] [--gas 1] [--engines zerolite3,zerolite2,fsdp2,ddp,deepspeed]
    [--steps 6] [--warmup 2] [--merge earlier.json,...]
`--configs` names JSON configs of benchmarks/peers/configs.py; `--gas` the micro-batches per
optimizer step (micro-batch = global batch / world / gas). DDP and FSDP2 read no ZeRO keys, so
they run once per (size, dtype, world, gas) and stand for every config of it. `--merge` takes
results of earlier runs (same workload) instead of running those engine/cell jobs again.
DeepSpeed is optional: skipped with a message when it does not import in the workers'
environment (run this script with the Python of a venv that has it).
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
from benchmarks.peers.configs import CONFIGS
from benchmarks.peers.engines import ENGINES
from benchmarks.plots import save
from benchmarks.plots.peers import peers_figure

REPO = Path(__file__).resolve().parents[2]


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
        text = log.read_text().strip().splitlines()
        # torchrun's summary banner says little: keep the lines that name the failure.
        keys = ("Error", "error:", "terminate", "Signal", "signal", "Traceback")
        named = [ln.strip() for ln in text if any(k in ln for k in keys)][-4:]
        return False, f"exit {r.returncode}: " + " | ".join(named or text[-3:])
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


def run_engine(engine, size, dtype, world, steps, warmup, tmp: Path, timeout: float,
               config: str = "tuned", gas: int = 1) -> dict:
    out = tmp / f"{engine}_{size}_{dtype}_w{world}_{config}_g{gas}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(world), "-m", "benchmarks.peers.worker", "--engine", engine, "--size", size,
           "--dtype", dtype, "--config", config, "--gas", str(gas), "--steps", str(steps),
           "--warmup", str(warmup), "--out", str(out)]
    ok, msg = _run(cmd, timeout, out.with_suffix(".log"))
    if not ok:
        return {"engine": engine, "size": size, "dtype": dtype, "world": world,
                "config": config, "gas": gas, "status": "failed", "reason": msg}
    res = json.loads(out.read_text())
    res.update(status="ok", wall_s=float(msg.split()[0]))
    return res


CONFIG_FREE = ("ddp", "fsdp2")
"""Engines that read no ZeRO keys: one run per (size, dtype, world, gas) for every config."""


def cell(r: dict) -> tuple:
    return (r["size"], r["dtype"], r["world"], r.get("config", "tuned"), r.get("gas", 1))


def lookup(by_key: dict, engine: str, c: tuple):
    return by_key.get((engine, *c)) or by_key.get((engine, *c[:3], "any", c[4]))


def compare(results: list[dict], refs: dict) -> None:
    by_key = {(r["engine"], *cell(r)): r for r in results if r["status"] == "ok"}
    for r in results:
        if r["status"] != "ok":
            continue
        ref = refs.get((r["size"], r["dtype"]), {}).get("losses") or []
        n = min(len(ref), len(r["losses"]))
        r["ref_steps_compared"] = n
        r["max_abs_dloss"] = max((abs(a - b) for a, b in zip(r["losses"], ref)), default=None)
        r["max_rel_dloss"] = max((abs(a - b) / abs(b) for a, b in zip(r["losses"], ref)),
                                 default=None)
        for base in ("ddp", "zerolite3", "deepspeed", "fsdp2"):
            other = lookup(by_key, base, cell(r))
            r[f"time_vs_{base}"] = r["median_step_s"] / other["median_step_s"] if other else None
            r[f"cpu_vs_{base}"] = (r["cpu_s_per_step"] / other["cpu_s_per_step"]
                                   if other else None)
            r[f"mem_vs_{base}"] = r["peak_rss_mib"] / other["peak_rss_mib"] if other else None
            r[f"max_abs_dloss_vs_{base}"] = (max(abs(a - b) for a, b in
                                                 zip(r["losses"], other["losses"]))
                                             if other else None)


def _f(v, fmt="{:.3f}"):
    return "n/a" if v is None else fmt.format(v)


def _cells(report) -> list[tuple]:
    seen = []
    for r in report["results"]:
        c = cell(r)
        if c[3] != "any" and c not in seen:
            seen.append(c)
    return seen


def write_markdown(path: Path, report: dict, engines: list[str]) -> None:
    m = report["machine"]
    lines = ["# zerolite vs peers (CPU, gloo)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB; torch {m['torch']}, "
             f"Python {m['python']}. Steps: {report['settings']['steps']} timed after "
             f"{report['settings']['warmup']} warm-up; GPT seq_len {W.SEQ_LEN}, AdamW lr {W.LR}, "
             f"clip {W.CLIP} (fp64 norm in every engine). Configs: benchmarks/peers/configs.py.",
             "", "## zerolite ZeRO-3 per cell (ratios: zerolite / peer, same cell, same run)", "",
             "| size | dtype | world | config | mb x gas | zl3 step s | ×DeepSpeed | ×FSDP2 | ×DDP "
             "| zl3 CPU s/step | CPU ×DS | CPU ×FSDP2 | CPU ×DDP | zl3 RSS MiB | RSS ×DS "
             "| RSS ×FSDP2 | zl3 MiB sent/step | DS MiB sent | max \\|Δloss\\| zl3 vs DS |",
             "|" + "---|" * 19]
    by_key = {(r["engine"], *cell(r)): r for r in report["results"] if r["status"] == "ok"}
    for c in _cells(report):
        z = by_key.get(("zerolite3", *c))
        if z is None:
            continue
        ds = lookup(by_key, "deepspeed", c)
        mb = report["sizes"][c[0]]["global_batch"] // c[2] // c[4]
        lines.append(
            f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {mb}x{c[4]} | {z['median_step_s']:.3f} | "
            f"{_f(z['time_vs_deepspeed'], '{:.2f}')} | {_f(z['time_vs_fsdp2'], '{:.2f}')} | "
            f"{_f(z['time_vs_ddp'], '{:.2f}')} | {_f(z.get('cpu_s_per_step'))} | "
            f"{_f(z['cpu_vs_deepspeed'], '{:.2f}')} | {_f(z['cpu_vs_fsdp2'], '{:.2f}')} | "
            f"{_f(z['cpu_vs_ddp'], '{:.2f}')} | {z['peak_rss_mib']:.0f} | "
            f"{_f(z['mem_vs_deepspeed'], '{:.2f}')} | {_f(z['mem_vs_fsdp2'], '{:.2f}')} | "
            f"{z['bytes_sent_per_step'] / 2**20:.1f} | "
            f"{_f(ds['bytes_sent_per_step'] / 2**20 if ds else None, '{:.1f}')} | "
            f"{_f(z['max_abs_dloss_vs_deepspeed'], '{:.1e}')} |")
    lines += ["", "## Every run", "",
              "| engine | size | dtype | world | config | gas | median step s | CPU s/step | "
              "peak RSS MiB/rank | MiB sent/step/rank | load | exposed comm s | max \\|Δloss\\| vs ref |",
              "|" + "---|" * 13]
    for r in report["results"]:
        head = (f"| {r['engine']} | {r['size']} | {r['dtype']} | {r['world']} | "
                f"{r.get('config', 'tuned')} | {r.get('gas', 1)} |")
        if r["status"] != "ok":
            lines.append(head + f" {r['status']}: {r.get('reason', '')} |" + " |" * 6)
            continue
        lines.append(
            head + f" {r['median_step_s']:.3f} | {_f(r.get('cpu_s_per_step'))} | "
            f"{r['peak_rss_mib']:.0f} | {r['bytes_sent_per_step'] / 2**20:.1f} | "
            f"{_f((r.get('loadavg_1m_before_after') or [None])[0], '{:.1f}')} | "
            f"{_f(r['exposed_comm_s'])} | {_f(r['max_abs_dloss'], '{:.2e}')} "
            f"({r['ref_steps_compared']} steps) |")
    lines += ["", "config `any`: DDP and FSDP2 read no ZeRO keys; one run stands for every "
              "config of its (size, dtype, world, gas). DDP accumulates under `no_sync()` and "
              "all-reduces once per step; FSDP2 reduce-scatters every micro-step (its default).",
              "", "Peak RSS: psutil-sampled (10 ms) maximum per rank during the steps, slowest "
              "rank; every rank first builds the full fp32 model (same seed), so init memory is "
              "included. MiB sent: per rank per optimizer step, by each collective's algorithm "
              "(benchmarks/peers/wire_count.py; DDP's C++ all-reduce computed). CPU s/step: "
              "process CPU time (all threads) of the busiest rank, median; less sensitive than "
              "wall time to other load. load: 1-minute load average at job start (2 cores: above "
              "~2.5 means other processes competed for the CPUs).", "",
              f"## {path.stem}.png", "",
              "Per cell (config, micro-batch x accumulation), one bar per engine: wall time "
              "per step, CPU time per step and peak RSS per rank (legend in the picture)."]
    if report["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    lines += ["", "## Per-step losses (mean over ranks)", ""]
    for (key, ref) in report["references"].items():
        lines.append(f"- {key}: reference " + ", ".join(f"{v:.6f}" for v in ref.get("losses", [])))
    for r in report["results"]:
        if r["status"] == "ok":
            lines.append(f"  - {r['engine']} {'/'.join(map(str, cell(r)))}: "
                         + ", ".join(f"{v:.6f}" for v in r["losses"]))
    path.write_text("\n".join(lines) + "\n")


def write_png(path: Path, report: dict) -> None:
    """Grouped bars per engine and cell (benchmarks/plots/peers.py; `make plots` redraws it)."""
    save(peers_figure(report, source=path.stem + ".json"), path)


def load_merged(files: list[str], refs_only: bool = False) -> tuple[list[dict], dict]:
    results, refs = [], {}
    for f in files:
        old = json.loads(Path(f).read_text())
        if not refs_only:
            results += [r for r in old["results"] if r["status"] == "ok"]
        for key, ref in old["references"].items():
            size, dtype = key.split("/")
            if ref.get("losses"):
                refs[(size, dtype)] = ref
    return results, refs


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20M,80M")
    ap.add_argument("--worlds", default="2")
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--configs", default="tuned")
    ap.add_argument("--gas", default="1", help="comma-separated accumulation steps")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--merge", default="", help="comma-separated result JSONs to reuse")
    ap.add_argument("--merge-refs", default="", help="result JSONs whose references to reuse")
    ap.add_argument("--report-only", action="store_true",
                    help="write the report of the merged results; run no job")
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--name", default="peers", help="output file stem")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    args = ap.parse_args(argv)
    sizes, dtypes = args.sizes.split(","), args.dtypes.split(",")
    worlds = [int(w) for w in args.worlds.split(",")]
    gases = [int(g) for g in args.gas.split(",")]
    configs = [c for c in args.configs.split(",") if c]
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e}; choose from {','.join(ENGINES)}")
    for s_ in sizes:
        if s_ not in W.SIZES:
            ap.error(f"unknown size {s_}; choose from {','.join(W.SIZES)}")
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c}; choose from {','.join(CONFIGS)}")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    notes, skipped = [], {}
    results, refs = load_merged([f for f in args.merge.split(",") if f])
    refs = {**load_merged([f for f in args.merge_refs.split(",") if f], refs_only=True)[1],
            **refs}
    done = {(r["engine"], *cell(r)) for r in results}
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
                     "and fsdp2 keep bf16 compute copies of the params (fp32 masters; zerolite "
                     "reduces in bf16 as DeepSpeed, fsdp2 in fp32); "
                     "the bf16 reference uses autocast, so bf16 Δloss is rounding, ~1e-2")
    settings = {"sizes": sizes, "worlds": worlds, "dtypes": dtypes, "engines": engines,
                "configs": configs, "gas": gases, "steps": args.steps, "warmup": args.warmup}
    with tempfile.TemporaryDirectory(prefix="peers_") as tmpd:
        tmp = Path(tmpd)
        for size in sizes:
            for dtype in dtypes:
                if (size, dtype) not in refs and not args.report_only:
                    t0 = time.perf_counter()
                    refs[(size, dtype)] = run_reference(size, dtype, args.steps + args.warmup,
                                                        tmp, args.timeout)
                    print(f"[peers] reference {size} {dtype}: {time.perf_counter() - t0:.1f} s",
                          flush=True)
                for world in worlds:
                    for gas in gases:
                        if W.SIZES[size].global_batch % (world * gas):
                            notes.append(f"{size} world {world} gas {gas} skipped: global batch "
                                         f"{W.SIZES[size].global_batch} does not split")
                            continue
                        for engine in engines:
                            for config in (["any"] if engine in CONFIG_FREE else configs):
                                key = (engine, size, dtype, world, config, gas)
                                if key in done or args.report_only:
                                    continue
                                done.add(key)
                                if engine in skipped:
                                    results.append({"engine": engine, "size": size,
                                                    "dtype": dtype, "world": world,
                                                    "config": config, "gas": gas,
                                                    "status": "skipped",
                                                    "reason": skipped[engine]})
                                    continue
                                r = run_engine(engine, size, dtype, world, args.steps,
                                               args.warmup, tmp, args.timeout,
                                               config="tuned" if config == "any" else config,
                                               gas=gas)
                                r["config"] = config
                                results.append(r)
                                print(f"[peers] {engine} {size} {dtype} w{world} {config} "
                                      f"gas {gas}: " +
                                      (f"{r['median_step_s']:.3f} s/step, cpu "
                                       f"{r['cpu_s_per_step']:.3f} s, "
                                       f"{r['peak_rss_mib']:.0f} MiB, "
                                       f"{r['bytes_sent_per_step'] / 2**20:.1f} MiB sent"
                                       if r["status"] == "ok" else r["reason"]), flush=True)
    compare(results, refs)
    for (s_, d), ref in refs.items():
        if ref.get("note"):
            notes.append(f"{s_} {d}: {ref['note']}")
        if ref.get("error"):
            notes.append(f"{s_} {d}: reference failed: {ref['error']}")
    all_sizes = sorted({r["size"] for r in results} | set(sizes))
    report = {"machine": W.machine_info(), "settings": settings,
              "sizes": {s_: W.size_info(W.SIZES[s_]) for s_ in all_sizes},
              "references": {f"{s_}/{d}": r for (s_, d), r in refs.items()},
              "results": results, "notes": notes}
    (out_dir / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    write_png(out_dir / f"{args.name}.png", report)
    write_markdown(out_dir / f"{args.name}.md", report, engines)
    print(f"[peers] wrote {out_dir / args.name}.{{json,md,png}}", flush=True)
    return report


if __name__ == "__main__":
    main()
