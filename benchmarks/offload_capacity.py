"""The largest GPT that trains at world 2 with peak RSS <= a per-rank budget (default 4 GiB),
without offload and with NVMe offload of the optimizer state: found by running it.

Each probe is two fresh rank processes (gloo on 127.0.0.1, one intra-op thread each) that
build zerolite's GPT under `zerolite.zero.Init` (no rank holds the whole model: the JSON
records Init's peak parameter bytes next to the full model's), train --steps steps of ZeRO-3
fp32 AdamW (micro-batch --batch x --seq tokens per rank, clipping 1.0) and report
ru_maxrss. A probe fits when both ranks finish and both peaks are within the budget; a rank
whose RSS passes the budget stops itself at once (exit 3), so failed probes are cheap and
never push the shared machine into swap. The depth is searched (doubling, then bisection)
at a fixed width, sequence and batch.

    PYTHONPATH=. python benchmarks/offload_capacity.py --out benchmarks/results/offload_capacity.json

Memory is what is measured; step times come from a shared machine (read them as rough).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

MIB = 2 ** 20
OVER_BUDGET = 3


def _guard(budget: int) -> None:
    """Exit the process as soon as its RSS passes `budget` (checked every 20 ms)."""
    import psutil

    proc = psutil.Process()

    def watch():
        while True:
            if proc.memory_info().rss > budget:
                os._exit(OVER_BUDGET)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()


def _zero_cfg(args) -> dict:
    zero = {"stage": 3}
    if args.reuse_distance is not None:  # else DeepSpeed's default (1e9), as a user's config
        zero["stage3_max_reuse_distance"] = args.reuse_distance
    if args.mode in ("nvme", "nvme+param"):
        zero.update(offload_optimizer={"device": "nvme", "nvme_path": args.swap},
                    sub_group_size=args.sub_group_size)
    if args.mode == "nvme+param":
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.swap}
    return zero


def _worker(args) -> dict:
    import torch
    import torch.distributed as dist

    import zerolite
    from zerolite.models import GPT, GPTConfig
    from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer

    torch.set_num_threads(1)
    _guard(args.budget_mib * MIB)
    dist.init_process_group("gloo", rank=args.rank, world_size=2)
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=args.layers,
                    n_head=args.d_model // 64, d_model=args.d_model)
    torch.manual_seed(0)
    with zerolite.zero.Init() as init:
        model = GPT(cfg)
    ds = {"train_batch_size": 2 * args.batch, "train_micro_batch_size_per_gpu": args.batch,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "gradient_clipping": 1.0,
          "zero_optimization": _zero_cfg(args), "steps_per_print": 10 ** 9}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=ds)
    g = torch.Generator().manual_seed(args.rank)
    times, losses = [], []
    for _ in range(args.steps):
        x = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len), generator=g)
        start = time.perf_counter()
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    out = {"rank": args.rank, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "step_s": times, "losses": losses,
           "init_peak_param_mib": init.peak_param_bytes / MIB,
           "init_kept_param_mib": init.partitioned_bytes / MIB,
           "full_model_param_mib": 4 * cfg.num_params() / MIB,
           "memory_stats_mib": {k: v / MIB for k, v in engine.memory_stats().items()
                             if isinstance(v, (int, float))}}
    if isinstance(engine.optimizer, ChunkedOffloadOptimizer):
        s = engine.optimizer.offload_stats()
        out.update(disk_mib=s["disk_bytes"] / MIB,
                   read_written_mib_per_step=[s["bytes_read"] / MIB / max(1, args.steps - 1),
                                              s["bytes_written"] / MIB / args.steps])
    return out


def _probe(args, mode: str, layers: int) -> dict:
    from zerolite.models import GPTConfig

    params = GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=layers,
                       n_head=args.d_model // 64, d_model=args.d_model).num_params()
    swap = tempfile.mkdtemp(prefix="zl-capacity-", dir=args.nvme_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs, paths = [], []
    start = time.perf_counter()
    for rank in range(2):
        paths.append(os.path.join(swap, f"result{rank}.json"))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
               "--rank", str(rank), "--layers", str(layers), "--result", paths[-1],
               "--swap", swap] + _shared_flags(args)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    codes = _wait_all(procs, args.probe_timeout)
    row = {"mode": mode, "layers": layers, "params": params, "exit_codes": codes,
           "wall_s": time.perf_counter() - start}
    if all(c == 0 for c in codes):
        row["ranks"] = [json.load(open(p)) for p in paths]
        row["fits"] = all(r["peak_rss_mib"] <= args.budget_mib for r in row["ranks"])
    else:
        row["fits"] = False
        row["why"] = ("over budget (a rank passed it and stopped)" if OVER_BUDGET in codes
                      else "failed: " + " | ".join((p.stderr.read() or "")[-400:] for p in procs))
    shutil.rmtree(swap, ignore_errors=True)
    print(json.dumps({k: v for k, v in row.items() if k != "ranks"}
                     | {"peak_rss_mib": [r["peak_rss_mib"] for r in row.get("ranks", [])]}),
          flush=True)
    return row


def _wait_all(procs, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:  # one rank gone: the other would hang
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    return [p.returncode for p in procs]


def _search(args, mode: str) -> dict:
    """Largest depth that fits: double from --start until a probe fails, then bisect."""
    probes, fit, fail = [], None, None
    layers = args.start
    while fail is None or (fit or 0) + 1 < fail:
        if fail is None and fit is not None:
            layers = fit * 2
        elif fail is not None:
            layers = ((fit or 0) + fail) // 2
        row = _probe(args, mode, layers)
        probes.append(row)
        if row["fits"]:
            fit = layers
        else:
            fail = layers
            if layers <= 1:
                break
        if fail is None and fit is not None and fit >= args.max_layers:
            break
    best = next((p for p in probes if p["layers"] == fit), None)
    return {"mode": mode, "largest_fitting_layers": fit, "smallest_failing_layers": fail,
            "largest": best, "probes": probes}


def _shared_flags(a) -> list[str]:
    return ["--d-model", str(a.d_model), "--vocab", str(a.vocab), "--seq", str(a.seq),
            "--batch", str(a.batch), "--steps", str(a.steps), "--budget-mib",
            str(a.budget_mib), "--sub-group-size", str(a.sub_group_size)] + \
        ([] if a.reuse_distance is None else ["--reuse-distance", str(a.reuse_distance)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--budget-mib", type=int, default=4096)
    p.add_argument("--sub-group-size", type=int, default=10_000_000)
    p.add_argument("--modes", default="none,nvme")
    p.add_argument("--reuse-distance", type=int, default=None,
                   help="zero_optimization.stage3_max_reuse_distance (default: DeepSpeed's)")
    p.add_argument("--start", type=int, default=8, help="first depth probed")
    p.add_argument("--max-layers", type=int, default=256)
    p.add_argument("--probe-timeout", type=float, default=1200)
    p.add_argument("--nvme-path", default=tempfile.gettempdir())
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode")
    p.add_argument("--rank", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--result")
    p.add_argument("--swap")
    args = p.parse_args()
    if args.worker:
        res = _worker(args)
        with open(args.result, "w") as f:
            json.dump(res, f)
        os._exit(0)  # skip process-group teardown
    report = {"config": {k: v for k, v in vars(args).items() if k not in (
        "worker", "mode", "rank", "layers", "result", "swap")} | {
        "world_size": 2, "stage": 3, "dtype": "fp32", "optimizer": "AdamW"},
        "note": "memory measured per rank (ru_maxrss); step times from a shared 2-core "
                "machine with other jobs running: rough"}
    for mode in args.modes.split(","):
        report[mode] = _search(args, mode)
    text = json.dumps(report, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    for mode in args.modes.split(","):
        r = report[mode]
        print(mode, "largest fitting layers:", r["largest_fitting_layers"],
              "params:", r["largest"]["params"] if r["largest"] else None)


if __name__ == "__main__":
    main()
