"""Peak RSS, step time and disk traffic per rank: NVMe optimizer offload vs none, world 2.

Each mode runs in fresh processes (one per rank, gloo on 127.0.0.1, one intra-op thread), so
ru_maxrss is that run's own peak. ZeRO-3, fp32, AdamW, a GPT of --d-model/--layers.

    PYTHONPATH=. python benchmarks/offload_nvme.py --nvme-path /tmp/zl-swap \
        --out benchmarks/results/offload_nvme.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MIB = 2 ** 20


def _worker(args) -> dict:
    import psutil
    import torch
    import torch.distributed as dist

    import zerolite
    from zerolite.models import GPT, GPTConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=2)
    base_rss = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=64, n_layer=args.layers, n_head=8,
                    d_model=args.d_model)
    model = GPT(cfg)
    zero = {"stage": 3}
    if args.mode == "nvme":
        zero.update(offload_optimizer={"device": "nvme", "nvme_path": args.nvme_path},
                    sub_group_size=args.sub_group_size)
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "gradient_clipping": 1.0, "zero_optimization": zero, "steps_per_print": 10 ** 9}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=ds)
    g = torch.Generator().manual_seed(args.rank)
    times, io = [], []
    for _ in range(args.steps):
        x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
        before = engine.optimizer.offload_stats() if args.mode == "nvme" else None
        start = time.perf_counter()
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        if before is not None:
            after = engine.optimizer.offload_stats()
            io.append({k: after[k] - before[k] for k in ("bytes_read", "bytes_written")})
    mem = engine.memory_stats()
    out = {"rank": args.rank, "params": cfg.num_params(),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "base_rss_mib": base_rss / MIB, "step_s": times,
           "optimizer_state_in_ram_mib": mem["optimizer_state"] / MIB}
    if args.mode == "nvme":
        s = engine.optimizer.offload_stats()
        out.update(io_per_step=io, disk_mib=s["disk_bytes"] / MIB,
                   chunk_buffers_mib=s["buffer_bytes"] / MIB)
    return out


def _run_mode(mode: str, args) -> list[dict]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    outs, procs = [], []
    for rank in range(2):
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        outs.append(path)
        cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--rank", str(rank),
               "--result", path] + _shared_flags(args)
        procs.append(subprocess.Popen(cmd, env=env))
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"{mode}: a rank failed")
    res = []
    for path in outs:
        with open(path) as f:
            res.append(json.load(f))
        os.remove(path)
    return res


def _shared_flags(a) -> list[str]:
    return ["--d-model", str(a.d_model), "--layers", str(a.layers), "--vocab", str(a.vocab),
            "--steps", str(a.steps), "--sub-group-size", str(a.sub_group_size),
            "--nvme-path", a.nvme_path]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--sub-group-size", type=int, default=1_000_000)
    p.add_argument("--nvme-path", default=os.path.join(tempfile.gettempdir(), "zerolite-swap"))
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode", choices=("none", "nvme"))
    p.add_argument("--rank", type=int)
    p.add_argument("--result")
    args = p.parse_args()
    if args.worker:
        res = _worker(args)
        with open(args.result, "w") as f:
            json.dump(res, f)
        os._exit(0)  # skip process-group teardown
    report = {"config": vars(args) | {"world_size": 2, "stage": 3, "dtype": "fp32"},
              "note": "shared 2-core machine; timings are noisy, compare ratios of one run"}
    for mode in ("none", "nvme"):
        report[mode] = _run_mode(mode, args)
    steady = lambda r: sum(r["step_s"][1:]) / max(1, len(r["step_s"]) - 1)  # noqa: E731
    n, o = report["none"], report["nvme"]
    report["summary"] = {
        "params": n[0]["params"],
        "adam_moments_per_rank_mib": 8 * n[0]["params"] / 2 / MIB,
        "peak_rss_mib": {"none": [r["peak_rss_mib"] for r in n],
                         "nvme": [r["peak_rss_mib"] for r in o]},
        "peak_rss_saved_mib": [a["peak_rss_mib"] - b["peak_rss_mib"] for a, b in zip(n, o)],
        "steady_step_s": {"none": [steady(r) for r in n], "nvme": [steady(r) for r in o]},
        "step_time_ratio_nvme_over_none": [steady(b) / steady(a) for a, b in zip(n, o)],
        "disk_mib_per_step_read_written": [
            [r["io_per_step"][-1]["bytes_read"] / MIB, r["io_per_step"][-1]["bytes_written"] / MIB]
            for r in o],
    }
    text = json.dumps(report, indent=1)
    print(json.dumps(report["summary"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
