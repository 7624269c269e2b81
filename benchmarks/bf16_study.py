"""bf16 study (issue 12): how far does each engine's bf16 run drift from its own fp32 run?

    PYTHONPATH=. python benchmarks/bf16_study.py [--seeds 0,1,2,3,4] [--out benchmarks/results]

For each workload and seed, ZeRO-3 at world 2 trains the same model on the same global
batches in fp32 and in bf16; the metric is the mean over steps of |bf16 loss - fp32 loss|
(and the final eval loss, bf16 / fp32). Engines:
  zerolite   ZeRO-3, bf16 params, fp32 masters, gradients reduced and summed in bf16
             (its defaults, DeepSpeed's)
  reference  plain torch, one process (zerolite/testing/bf16_reference.py): a bf16 module
             copy for forward/backward, fp32 masters updated by torch AdamW, re-cast each
             step; the global batch in 2 pieces whose bf16 grads are averaged as
             ZeRO-3 averages them (= world 2)
  torch-1    the same reference with one bf16 backward over the whole global batch
  deepspeed  DeepSpeed ZeRO-3 as its users run it on CPU (defaults; torch_adam: no op
             build), when /work/venv-ds (or $DS_PYTHON) imports deepspeed
Workloads: "cnn" is the DeepSpeed CIFAR-10 tutorial's CNN with its loss in the model's
dtype (bf16 in a bf16 run, as the tutorial computes it); "cnn-fp32loss" the same with the
loss computed in fp32; "gpt" the small GPT of zerolite/models (its loss is in fp32).
Saves bf16_study.json and bf16_study.md under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from zerolite.models import GPT, GPTConfig
from zerolite.models.cifar_cnn import CifarNet, cifar_batches
from zerolite.testing.bf16_reference import split_rows, train_bf16_master_reference
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import make_token_batches

WORLD = 2
EVAL_BATCHES = 4
GPT_CFG = GPTConfig(vocab_size=256, seq_len=32, n_layer=2, n_head=2, d_model=64)
WORKLOADS = {  # name: (steps, global batch, lr, gradient clipping)
    "cnn": (64, 16, 1e-3, 1.0),
    "cnn-fp32loss": (64, 16, 1e-3, 1.0),
    "gpt": (64, 8, 3e-3, 1.0),
}
DS_PYTHON = os.environ.get("DS_PYTHON", "/work/venv-ds/bin/python")


def build_model(workload: str, seed: int):
    torch.manual_seed(seed)
    return GPT(GPT_CFG) if workload == "gpt" else CifarNet()


def make_batches(workload: str, seed: int, steps: int):
    steps_total = steps + EVAL_BATCHES  # the last ones are held out for eval
    _, gb, _, _ = WORKLOADS[workload]
    if workload == "gpt":
        return make_token_batches(steps_total, gb, GPT_CFG.seq_len, GPT_CFG.vocab_size, seed=seed)
    return cifar_batches(steps_total, gb, seed=seed)


def loss_of(workload: str, model, x, y, dtype: torch.dtype):
    """The loss as each workload's user computes it (model may be an engine)."""
    if workload == "gpt":
        return model(x, y)  # GPT computes its cross-entropy in fp32
    out = model(x.to(dtype))  # the user casts inputs to the model's dtype (tutorial)
    return F.cross_entropy(out.float() if workload == "cnn-fp32loss" else out, y)


def _engine(kind: str, model, workload: str, bf16: bool):
    steps, gb, lr, clip = WORKLOADS[workload]
    cfg = {"train_batch_size": gb, "train_micro_batch_size_per_gpu": gb // WORLD,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
           "gradient_clipping": clip, "zero_optimization": {"stage": 3},
           "bf16": {"enabled": bf16}}
    if kind == "deepspeed":
        import deepspeed

        cfg["optimizer"]["params"]["torch_adam"] = True
        return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                    config=cfg)[0]
    import zerolite

    return zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]


def _mean_over_ranks(value: float) -> float:
    t = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _rank_run(rank, world, kind, workload, seed, bf16):
    """One rank of one engine run: per-step global-mean losses and the final eval loss."""
    steps = WORKLOADS[workload][0]
    dtype = torch.bfloat16 if bf16 else torch.float32
    batches = make_batches(workload, seed, steps)
    engine = _engine(kind, build_model(workload, seed), workload, bf16)
    losses = []
    for batch in batches[:steps]:
        x, y = split_rows(batch, world)[rank]
        loss = loss_of(workload, engine, x, y, dtype)
        engine.backward(loss)
        engine.step()
        losses.append(_mean_over_ranks(loss.float().item()))
    engine.eval()
    with torch.no_grad():
        ev = [loss_of(workload, engine, *split_rows(b, world)[rank], dtype).float().item()
              for b in batches[steps:]]
    return {"losses": losses, "eval": _mean_over_ranks(sum(ev) / len(ev))}


def run_engine(kind, workload, seed, bf16):
    return run_ranks(_rank_run, WORLD, kind, workload, seed, bf16, timeout_s=600)[0]


def run_reference(workload, seed, bf16, world):
    steps, _, lr, clip = WORKLOADS[workload]
    dtype = torch.bfloat16 if bf16 else torch.float32
    batches = make_batches(workload, seed, steps)
    model = build_model(workload, seed)
    losses, state = train_bf16_master_reference(
        model, batches[:steps], lambda m, x, y: loss_of(workload, m, x, y, dtype),
        lambda ps: torch.optim.AdamW(ps, lr=lr, weight_decay=0.0),
        clip=clip, world=world, dtype=dtype)
    model.load_state_dict(state)  # the masters; the run's module is their cast to dtype
    model.to(dtype).eval()
    with torch.no_grad():
        ev = [statistics.fmean(loss_of(workload, model, x, y, dtype).float().item()
                               for x, y in split_rows(b, world)) for b in batches[steps:]]
    return {"losses": losses, "eval": statistics.fmean(ev)}


def drift(bf16_run, fp32_run) -> dict:
    d = [abs(a - b) for a, b in zip(bf16_run["losses"], fp32_run["losses"])]
    return {"mean_abs_dloss": statistics.fmean(d), "max_abs_dloss": max(d),
            "eval_ratio": bf16_run["eval"] / fp32_run["eval"]}


def deepspeed_worker(jobs_json: str) -> None:
    """Runs in DeepSpeed's interpreter: every (workload, seed, bf16) job, JSON to stdout."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("DS_BUILD_OPS", "0")
    import deepspeed  # noqa: F401 - imported once, before the ranks fork

    out = [run_engine("deepspeed", w, s, b) for w, s, b in json.loads(jobs_json)]
    print("RESULT " + json.dumps(out), flush=True)


def run_deepspeed(jobs: list) -> tuple[list | None, str]:
    if not pathlib.Path(DS_PYTHON).exists():
        return None, f"{DS_PYTHON} not found"
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]),
               DS_ACCELERATOR="cpu", DS_BUILD_OPS="0")
    r = subprocess.run([DS_PYTHON, __file__, "--deepspeed-worker", json.dumps(jobs)],
                       env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not lines:
        return None, "deepspeed run failed: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    ver = subprocess.run([DS_PYTHON, "-c", "import deepspeed; print(deepspeed.__version__)"],
                         env=env, capture_output=True, text=True).stdout.strip().splitlines()
    return json.loads(lines[-1][len("RESULT "):]), f"deepspeed {ver[-1] if ver else '?'}"


def summarize(per_seed: dict) -> dict:
    """engine -> {workload -> mean/stdev/min/max over seeds of the per-seed drift}."""
    out = {}
    for (engine, workload), rows in per_seed.items():
        vals = [r["mean_abs_dloss"] for r in rows.values()]
        ev = [r["eval_ratio"] for r in rows.values()]
        out.setdefault(engine, {})[workload] = {
            "mean": statistics.fmean(vals), "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "per_seed": {s: r["mean_abs_dloss"] for s, r in rows.items()},
            "eval_ratio_mean": statistics.fmean(ev)}
    return out


def markdown(summary: dict, same_algo: dict, seeds: list, notes: list) -> str:
    lines = [f"bf16 vs fp32, ZeRO-3 world {WORLD}, seeds {seeds}: mean over steps of |bf16 loss - "
             "fp32 loss| of each engine's bf16 run to its own fp32 run; mean ± stdev over seeds "
             "[min-max]; eval = final eval loss bf16/fp32.", "",
             "| workload (steps) | engine | mean \\|Δloss\\| | per seed | eval bf16/fp32 |",
             "|---|---|---|---|---|"]
    for workload in WORKLOADS:
        for engine in summary:
            s = summary[engine].get(workload)
            if s is None:
                continue
            per = " / ".join(f"{v:.4f}" for v in s["per_seed"].values())
            lines.append(f"| {workload} ({WORKLOADS[workload][0]}) | {engine} | {s['mean']:.4f} ± "
                         f"{s['stdev']:.4f} [{s['min']:.4f}-{s['max']:.4f}] | {per} | "
                         f"{s['eval_ratio_mean']:.3f} |")
    lines += ["", "zerolite bf16 vs the reference bf16 (same world), max |Δloss| over all steps "
              "and seeds: " + ", ".join(f"{w} {v:.3g}" for w, v in same_algo.items()), ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    ap.add_argument("--deepspeed-worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.deepspeed_worker:
        return deepspeed_worker(args.deepspeed_worker)
    torch.set_num_threads(1)  # as each rank runs; the reference's numerics do not depend on it
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    start = time.perf_counter()
    runs, per_seed, same_algo, notes = {}, {}, {}, []
    for w in workloads:
        for s in seeds:
            for bf16 in (False, True):
                runs["zerolite", w, s, bf16] = run_engine("zerolite", w, s, bf16)
                runs["reference", w, s, bf16] = run_reference(w, s, bf16, world=WORLD)
                runs["torch-1", w, s, bf16] = run_reference(w, s, bf16, world=1)
            print(f"[bf16] {w} seed {s} done ({time.perf_counter() - start:.0f}s)", flush=True)
        same_algo[w] = max(abs(a - b) for s in seeds for a, b in zip(
            runs["zerolite", w, s, True]["losses"], runs["reference", w, s, True]["losses"]))
    engines = ["zerolite", "reference", "torch-1"]
    if not args.no_deepspeed:
        # Not cnn-fp32loss: DeepSpeed's CPU start-up (~30 s a run here) would double the time.
        jobs = [(w, s, b) for w in workloads if w != "cnn-fp32loss" for s in seeds
                for b in (False, True)]
        results, msg = run_deepspeed(jobs)
        notes.append(msg if results else f"deepspeed skipped: {msg}")
        if results:
            engines.append("deepspeed")
            runs.update({("deepspeed", *job): r for job, r in zip(map(tuple, jobs), results)})
    for e in engines:
        for w in workloads:
            if (e, w, seeds[0], True) not in runs:
                continue
            per_seed[e, w] = {s: drift(runs[e, w, s, True], runs[e, w, s, False]) for s in seeds}
    summary = summarize(per_seed)
    notes.append(f"total {time.perf_counter() - start:.0f}s on a shared 2-core CPU (torch "
                 f"{torch.__version__}); numerics do not depend on load")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bf16_study.json").write_text(json.dumps({
        "world": WORLD, "seeds": seeds, "workloads": {w: WORKLOADS[w] for w in workloads},
        "summary": summary, "zerolite_vs_reference_max_abs_dloss": same_algo, "notes": notes,
        "runs": {"|".join(map(str, k)): v for k, v in runs.items()}}, indent=1))
    md = markdown(summary, same_algo, seeds, notes)
    (out / "bf16_study.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
