"""Quality of bf16 master weights: the same GPT trained with fp32 masters and with bf16 masters
+ bf16 Adam states (bf16.bf16_master_weights_and_grads + bf16_optimizer_states) under each
zerolite.master_rounding, from the same initial weights on the same batches.

    python benchmarks/bf16_masters.py --model demo --steps 300      # the `make demo` GPT
    python benchmarks/bf16_masters.py --model 20M --steps 120 --micro 4

Variants (ZeRO-3, world 2 on gloo/CPU, the demo's config: AdamW lr 3e-3 (--lr), betas (0.9, 0.95),
weight decay 0.1, warmup-decay to 0 over the run, clipping 1.0):
  fp32        fp32 training (the masters are the fp32 params)
  bf16        bf16 compute with fp32 masters and fp32 moments (DeepSpeed's default bf16)
  nearest     bf16 masters + states, round to nearest (what DeepSpeed 0.18+ does)
  kahan       bf16 masters + states + a bf16 compensation buffer
  stochastic  bf16 masters + states, stochastic rounding
Per step: the mean loss over ranks and the step time; per run: the model-state bytes per
parameter from engine.memory_stats() (all ranks, at the last accumulation boundary).
Final loss: the mean of the last --last steps. Results: benchmarks/results/bf16_masters_<model>.json
and the picture beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sparse_grads import MODELS, add_workload_args, machine  # noqa: E402
from zerolite.models import GPT  # noqa: E402
from zerolite.models.byte_data import ByteWindows, stdlib_bytes  # noqa: E402
from zerolite.testing.multiprocess import run_ranks  # noqa: E402

VARIANTS = ("fp32", "bf16", "nearest", "kahan", "stochastic")


def config(variant: str, steps: int, micro: int, lr: float | None = None) -> dict:
    cfg = json.loads((ROOT / "configs" / "demo_zero3_cpu.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = micro
    if lr is not None:
        cfg["optimizer"]["params"]["lr"] = cfg["scheduler"]["params"]["warmup_max_lr"] = lr
    cfg["scheduler"]["params"]["total_num_steps"] = steps
    cfg["scheduler"]["params"]["warmup_num_steps"] = max(1, min(20, steps // 10))
    cfg["steps_per_print"] = 10 ** 6
    if variant != "fp32":
        cfg["bf16"] = {"enabled": True}
    if variant in ("nearest", "kahan", "stochastic"):
        cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
        cfg["zerolite"] = {"master_rounding": variant}
    return cfg


def _train(rank, world, model_name, variant, steps, micro, lr):
    import zerolite

    torch.manual_seed(0)
    cfg = MODELS[model_name]
    model = GPT(cfg)
    num_params = sum(p.numel() for p in model.parameters())
    data = ByteWindows(stdlib_bytes(), cfg.seq_len, num_windows=steps * world * micro)
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=config(variant, steps, micro, lr))
    losses, times, state = [], [], None
    for step in range(steps):
        lo = (step * world + rank) * micro
        items = [data[i] for i in range(lo, lo + micro)]
        x = torch.stack([a for a, _ in items])
        y = torch.stack([b for _, b in items])
        t0 = time.perf_counter()
        loss = engine(x, y)
        loss.backward()  # DeepSpeed >= 0.18 style
        if step == steps - 1:
            ms = engine.memory_stats()
            state = ms["param_shards"] + ms["grad_shards"] + ms["master_shards"] \
                + ms["optimizer_state"]
        engine.step()
        times.append(time.perf_counter() - t0)
        total = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(total.item() / world)
    nbytes = torch.tensor([state], dtype=torch.float64)
    dist.all_reduce(nbytes)
    return {"losses": losses, "step_s": times, "num_params": num_params,
            "state_bytes_per_param": nbytes.item() / num_params}


def summarize(runs: dict, last: int) -> dict:
    out = {}
    for name, r in runs.items():
        skip = min(5, len(r["step_s"]) - 1)
        out[name] = {"final_loss": statistics.fmean(r["losses"][-last:]),
                     "median_step_s": statistics.median(r["step_s"][skip:]),
                     "state_bytes_per_param": r["state_bytes_per_param"]}
    base = out.get("bf16")
    for s in out.values():
        if base:
            s["loss_vs_bf16_fp32_masters"] = s["final_loss"] / base["final_loss"] - 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--lr", type=float, default=None,
                    help="peak learning rate (default: the demo config's 3e-3)")
    ap.add_argument("--last", type=int, default=20, help="final loss = mean of the last N steps")
    ap.add_argument("--append", action="store_true", help="add to the runs already in --out")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / f"bf16_masters_{args.model}.json"
    result = {"model": args.model, "num_params": None, "steps": args.steps, "world": args.world,
              "micro_batch": args.micro, "stage": 3,
              "lr": config("fp32", args.steps, args.micro, args.lr)["optimizer"]["params"]["lr"],
              "last": args.last, "machine": machine(),
              "command": "python benchmarks/bf16_masters.py "
              + " ".join(argv if argv is not None else sys.argv[1:]), "runs": {}}
    if args.append and out.exists():
        old = json.loads(out.read_text())
        if (old["model"], old["steps"], old["world"], old["micro_batch"], old.get("lr", 3e-3)) \
                != (args.model, args.steps, args.world, args.micro, result["lr"]):
            ap.error(f"--append: {out} is another workload")
        result["runs"], result["command"] = old["runs"], old["command"] + " ; " + result["command"]
    for variant in args.variants:
        t0 = time.perf_counter()
        r = run_ranks(_train, args.world, args.model, variant, args.steps, args.micro,
                      args.lr, timeout_s=3600)[0]
        result["num_params"] = r.pop("num_params")
        result["runs"][variant] = r
        result["summary"] = summarize(result["runs"], args.last)
        result["machine"]["load_avg_end"] = os.getloadavg()[0]
        out.write_text(json.dumps(result, indent=1) + "\n")
        s = result["summary"][variant]
        print(f"{variant:>10}: final loss {s['final_loss']:.4f} "
              f"({s.get('loss_vs_bf16_fp32_masters', 0):+.2%} vs fp32 masters), "
              f"{s['state_bytes_per_param']:.2f} B/param, step {s['median_step_s'] * 1e3:.0f} ms,"
              f" {time.perf_counter() - t0:.0f}s", flush=True)
    try:
        from benchmarks.plots import save
        from benchmarks.plots.masters import masters_figure

        save(masters_figure(result, source=out.name), out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    except ImportError as exc:
        print(f"wrote {out} (no picture: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
