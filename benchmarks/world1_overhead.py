"""Engine overhead at world 1: zerolite ZeRO-3 vs plain single-process PyTorch.

At world 1 no communication exists, so any step-time difference is engine overhead. The
model is issue #16's 21M GPT (10 x 384, vocab 8192, seq 128), micro-batch 4, one thread,
AdamW, clipping 1.0 with a float64 norm in both. zerolite runs the user's DeepSpeed-style
config of the issue (DeepSpeed's usual bucket keys). Every variant runs in its own process;
rounds interleave the variants so that load from other processes on the machine spreads over
all of them; the report gives per-variant medians over rounds of the per-run median step.

    python benchmarks/world1_overhead.py [--rounds 3] [--steps 6] [--warmup 2]
        [--variants plain,zerolite,zerolite_mmap1m] [--out benchmarks/results/world1.json]
        [--profile benchmarks/results/world1_profile.txt]

Variants: plain (torch only); zerolite (the engine as it ships); zerolite_mmap1m (the user
opts in to zerolite.host_memory.fix_mmap_threshold() before initialize);
zerolite_keep_malloc (ZEROLITE_KEEP_MALLOC=1 in the environment, for engines that pin the
threshold themselves).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "zerolite", "zerolite_mmap1m", "zerolite_keep_malloc")
USER_ZERO3 = {"stage": 3, "reduce_bucket_size": 5e6, "stage3_prefetch_bucket_size": 5e6,
              "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 1e8,
              "stage3_max_reuse_distance": 1e8}
MICRO, LR, CLIP = 4, 1e-3, 1.0


def _gpt_config():
    from zerolite.models import GPTConfig

    return GPTConfig(vocab_size=8192, seq_len=128, n_layer=10, n_head=6, d_model=384)


def _batches(n: int, vocab: int, seq: int):
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        data = torch.randint(0, vocab, (MICRO, seq + 1), generator=g)
        out.append((data[:, :-1].contiguous(), data[:, 1:].contiguous()))
    return out


def _profile(variant: str, step, data, warmup: int) -> dict:
    """torch.profiler over the timed steps: the ops and zerolite:: labels by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    for x, y in data[:warmup]:
        step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, y in data[warmup:]:
            step(x, y)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    return {"variant": variant, "profile_table": table}


def run_one(variant: str, steps: int, warmup: int, profile: bool = False) -> dict:
    """One variant in this process (called in a fresh child)."""
    import torch

    torch.set_num_threads(1)
    if variant == "zerolite_mmap1m":
        from zerolite.host_memory import fix_mmap_threshold

        fix_mmap_threshold()
    from benchmarks.peers.worker import RssSampler
    from benchmarks.peers.workload import clip_fp64_
    from zerolite.models import GPT

    cfg = _gpt_config()
    torch.manual_seed(0)
    model = GPT(cfg)
    if variant == "plain":
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        params = list(model.parameters())

        def step(x, y):
            loss = model(x, y)
            loss.backward()
            clip_fp64_([p.grad for p in params], CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    else:
        import zerolite

        config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR}},
                  "gradient_clipping": CLIP, "zero_optimization": dict(USER_ZERO3)}
        engine, *_ = zerolite.initialize(model=model, config=config)

        def step(x, y):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            return loss
    times, cpu, losses = [], [], []
    data = _batches(warmup + steps, cfg.vocab_size, cfg.seq_len)
    if profile:
        return _profile(variant, step, data, warmup)
    with RssSampler() as rss:
        for i, (x, y) in enumerate(data):
            t0, c0 = time.perf_counter(), time.process_time()
            loss = step(x, y)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            losses.append(loss.item())
            if i >= warmup:
                times.append(dt)
                cpu.append(dc)
    return {"variant": variant, "params": sum(p.numel() for p in GPT(cfg).parameters()),
            "median_step_s": statistics.median(times), "step_times_s": times,
            "cpu_s_per_step": statistics.median(cpu), "peak_rss_mib": rss.peak / 2**20,
            "losses": losses, "loadavg_1m": os.getloadavg()[0]}


def _child(variant: str, steps: int, warmup: int, profile: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH")] if p)
    env.pop("ZEROLITE_KEEP_MALLOC", None)
    if variant == "zerolite_keep_malloc":
        env["ZEROLITE_KEEP_MALLOC"] = "1"
    extra = ["--profile", profile] if profile else []
    r = subprocess.run([sys.executable, __file__, "--child", variant, "--steps", str(steps),
                        "--warmup", str(warmup), *extra], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--variants", default="plain,zerolite,zerolite_mmap1m")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "world1.json"))
    ap.add_argument("--profile", metavar="FILE", help="profile each variant once (torch.profiler, "
                    "self CPU time) into FILE instead of timing")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child, args.steps, args.warmup, bool(args.profile))))
        return {}
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {','.join(VARIANTS)}")
    if args.profile:
        tables = [_child(v, args.steps, args.warmup, args.profile)["profile_table"]
                  for v in variants]
        Path(args.profile).write_text("".join(f"## {v}\n{t}\n" for v, t in zip(variants, tables)))
        print(f"[world1] wrote {args.profile}")
        return {}
    runs = []
    for rnd in range(args.rounds):
        for v in variants:
            r = _child(v, args.steps, args.warmup)
            r["round"] = rnd
            runs.append(r)
            print(f"[world1] round {rnd} {v}: {r['median_step_s']:.3f} s/step, "
                  f"cpu {r['cpu_s_per_step']:.3f} s, peak RSS {r['peak_rss_mib']:.0f} MiB, "
                  f"load {r['loadavg_1m']:.1f}", flush=True)
    summary = {}
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        summary[v] = {"median_step_s": statistics.median(r["median_step_s"] for r in mine),
                      "cpu_s_per_step": statistics.median(r["cpu_s_per_step"] for r in mine),
                      "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine),
                      "step_s_per_round": [r["median_step_s"] for r in mine]}
    if "plain" in summary:
        base = summary["plain"]
        plain_losses = next(r["losses"] for r in runs if r["variant"] == "plain")
        for v, s in summary.items():
            s["time_vs_plain"] = s["median_step_s"] / base["median_step_s"]
            s["cpu_vs_plain"] = s["cpu_s_per_step"] / base["cpu_s_per_step"]
            s["rss_minus_plain_mib"] = s["peak_rss_mib"] - base["peak_rss_mib"]
            losses = next(r["losses"] for r in runs if r["variant"] == v)
            s["max_abs_dloss_vs_plain"] = max(abs(a - b) for a, b in zip(losses, plain_losses))
    report = {"model": "GPT 10 x 384, vocab 8192, seq 128", "micro_batch": MICRO,
              "threads": 1, "zero_optimization": USER_ZERO3, "rounds": args.rounds,
              "steps": args.steps, "warmup": args.warmup, "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    for v, s in summary.items():
        print(f"[world1] {v}: median {s['median_step_s']:.3f} s "
              f"(x{s.get('time_vs_plain', float('nan')):.3f} plain), cpu "
              f"{s['cpu_s_per_step']:.3f} s, peak RSS {s['peak_rss_mib']:.0f} MiB", flush=True)
    return report


if __name__ == "__main__":
    main()
