"""Bytes vs convergence of the gradient-compression options: dense fp32, int8 / int4 qgZ and
top-k sparsified gradients (error feedback) at 10%, 1% and 0.1%.

    python benchmarks/sparse_grads.py --model demo --steps 300     # the `make demo` GPT
    python benchmarks/sparse_grads.py --model 20M --steps 60
    python -m benchmarks.plots                                      # redraw the pictures

Each variant trains the same GPT from the same initial weights on the same byte windows of
the Python standard library's sources (examples/train_gpt.py's data), ZeRO-3 at world 2 on
gloo/CPU, the demo's config (AdamW lr 3e-3, warmup-decay schedule over the run, clipping 1.0).
Per step it records the mean loss over ranks, the gradient-reduce bytes this rank handed to
the collectives (`engine.last_step_stats.reduce_bytes`: measured from the tensors sent, not
computed) and the step's wall time. Results: benchmarks/results/sparse_grads_<model>.json
(rewritten after every variant) and the picture beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zerolite.models import GPT, GPTConfig  # noqa: E402
from zerolite.models.byte_data import ByteWindows, stdlib_bytes  # noqa: E402
from zerolite.testing.multiprocess import run_ranks  # noqa: E402

MODELS = {"demo": GPTConfig(seq_len=128, n_layer=4, n_head=4, d_model=128),
          "20M": GPTConfig(vocab_size=256, seq_len=128, n_layer=11, n_head=6, d_model=384)}
VARIANTS = {  # name -> (zero_optimization extras, zerolite block)
    "dense": ({}, {}),
    "int8": ({"zero_quantized_gradients": True}, {"quantized_gradients_bits": 8}),
    "int4_ef": ({"zero_quantized_gradients": True},
                {"quantized_gradients_bits": 4, "quantized_error_feedback": True}),
    "topk_10%": ({}, {"sparse_gradients": {"ratio": 0.1}}),
    "topk_1%": ({}, {"sparse_gradients": {"ratio": 0.01}}),
    "topk_0.1%": ({}, {"sparse_gradients": {"ratio": 0.001}}),
    # not in the default set (--variants ...): error feedback off, and dense warmup steps
    "topk_1%_noef": ({}, {"sparse_gradients": {"ratio": 0.01, "error_feedback": False}}),
    "topk_1%_warmup50": ({}, {"sparse_gradients": {"ratio": 0.01, "warmup_steps": 50}}),
}
DEFAULT = ["dense", "int8", "int4_ef", "topk_10%", "topk_1%", "topk_0.1%"]


def config(variant: str, steps: int, micro: int, sgd_lr: float | None = None,
           clip: float | None = None) -> dict:
    zero_extra, extras = VARIANTS[variant]
    cfg = json.loads((ROOT / "configs" / "demo_zero3_cpu.json").read_text())
    if sgd_lr is not None:  # momentum SGD instead of the demo's AdamW (same schedule shape)
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": sgd_lr, "momentum": 0.9}}
        cfg["zero_allow_untested_optimizer"] = True  # SGD at ZeRO-3, as DeepSpeed asks
        cfg["scheduler"]["params"]["warmup_max_lr"] = sgd_lr
    cfg["train_micro_batch_size_per_gpu"] = micro
    if clip is not None:
        cfg["gradient_clipping"] = clip
    cfg["scheduler"]["params"]["total_num_steps"] = steps
    cfg["scheduler"]["params"]["warmup_num_steps"] = max(1, min(20, steps // 10))
    cfg["steps_per_print"] = 10 ** 6
    cfg["zero_optimization"].update(zero_extra)
    if extras:
        cfg["zerolite"] = extras
    return cfg


def _train(rank, world, model_name, variant, steps, micro, sgd_lr=None, clip=None):
    import zerolite

    torch.manual_seed(0)
    cfg = MODELS[model_name]
    model = GPT(cfg)
    num_params = sum(p.numel() for p in model.parameters())  # before sharding empties them
    data = ByteWindows(stdlib_bytes(), cfg.seq_len, num_windows=steps * world * micro)
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=config(variant, steps, micro, sgd_lr, clip))
    losses, reduce_bytes, times = [], [], []
    for step in range(steps):
        lo = (step * world + rank) * micro
        items = [data[i] for i in range(lo, lo + micro)]
        x = torch.stack([a for a, _ in items])
        y = torch.stack([b for _, b in items])
        t0 = time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
        total = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(total.item() / world)
        reduce_bytes.append(engine.last_step_stats.reduce_bytes)
    return {"losses": losses, "reduce_bytes": reduce_bytes, "step_s": times,
            "num_params": num_params}


def machine() -> dict:
    import psutil

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "mem_gib": round(psutil.virtual_memory().total / 2 ** 30, 1),
            "torch": torch.__version__, "load_avg_start": os.getloadavg()[0]}


def summarize(runs: dict, last: int) -> dict:
    out = {}
    dense = runs.get("dense")
    for name, r in runs.items():
        skip = min(5, len(r["step_s"]) - 1)
        s = {"final_loss": statistics.fmean(r["losses"][-last:]),
             "reduce_bytes_per_step": statistics.fmean(r["reduce_bytes"]),
             "median_step_s": statistics.median(r["step_s"][skip:])}
        if dense:
            d = out.get("dense") or {"final_loss": statistics.fmean(dense["losses"][-last:]),
                                     "reduce_bytes_per_step":
                                         statistics.fmean(dense["reduce_bytes"]),
                                     "median_step_s": statistics.median(dense["step_s"][skip:])}
            s["loss_vs_dense"] = s["final_loss"] / d["final_loss"] - 1
            s["bytes_vs_dense"] = s["reduce_bytes_per_step"] / d["reduce_bytes_per_step"]
            s["step_time_vs_dense"] = s["median_step_s"] / d["median_step_s"]
        out[name] = s
    return out


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The flags that name a training workload (shared with benchmarks/bf16_masters.py)."""
    ap.add_argument("--model", choices=list(MODELS), default="demo")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--micro", type=int, default=8, help="micro batch per rank")
    ap.add_argument("--world", type=int, default=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--variants", nargs="*", default=DEFAULT, choices=list(VARIANTS))
    ap.add_argument("--append", action="store_true",
                    help="add to the runs already in --out (same model, steps and world)")
    ap.add_argument("--last", type=int, default=20, help="final loss = mean of the last N steps")
    ap.add_argument("--sgd-lr", type=float, default=None,
                    help="train with momentum SGD (0.9) at this peak lr instead of AdamW")
    ap.add_argument("--clip", type=float, default=None,
                    help="gradient_clipping (default: the demo config's 1.0; 0 = off)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    tag = ("" if args.sgd_lr is None else "_sgd") + ("" if args.clip is None else
                                                       f"_clip{args.clip:g}")
    out = args.out or ROOT / "benchmarks" / "results" / f"sparse_grads_{args.model}{tag}.json"
    result = {"model": args.model, "num_params": None, "steps": args.steps,
              "optimizer": ("AdamW" if args.sgd_lr is None else f"SGD lr {args.sgd_lr} m 0.9")
              + ("" if args.clip is None else f", clipping {args.clip:g}"),
              "world": args.world, "micro_batch": args.micro, "stage": 3, "last": args.last,
              "machine": machine(), "command": "python benchmarks/sparse_grads.py "
              + " ".join(argv if argv is not None else sys.argv[1:]), "runs": {}}
    if args.append and out.exists():
        old = json.loads(out.read_text())
        if (old["model"], old["steps"], old["world"], old["micro_batch"]) != (
                args.model, args.steps, args.world, args.micro):
            ap.error(f"--append: {out} is another workload")
        result["runs"] = old["runs"]
        result["command"] = old["command"] + " ; " + result["command"]
    for variant in args.variants:
        t0 = time.perf_counter()
        r = run_ranks(_train, args.world, args.model, variant, args.steps, args.micro,
                      args.sgd_lr, args.clip, timeout_s=3600)[0]
        result["num_params"] = r.pop("num_params")
        result["runs"][variant] = r
        result["summary"] = summarize(result["runs"], args.last)
        result["machine"]["load_avg_end"] = os.getloadavg()[0]
        out.write_text(json.dumps(result, indent=1) + "\n")
        s = result["summary"][variant]
        print(f"{variant:>10}: final loss {s['final_loss']:.4f} "
              f"({s.get('loss_vs_dense', 0):+.2%} vs dense), reduce "
              f"{s['reduce_bytes_per_step'] / 2 ** 20:.3f} MiB/step "
              f"({s.get('bytes_vs_dense', 1):.4f} of dense), "
              f"step {s['median_step_s'] * 1e3:.0f} ms "
              f"({s.get('step_time_vs_dense', 1):.2f}x), {time.perf_counter() - t0:.0f}s",
              flush=True)
    try:
        from benchmarks.plots import save
        from benchmarks.plots.sparse import sparse_figure

        save(sparse_figure(result, source=out.name), out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    except ImportError as exc:  # matplotlib missing: the JSON is the result
        print(f"wrote {out} (no picture: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
