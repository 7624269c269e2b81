"""Peak RSS, step time and disk traffic per rank: NVMe offload vs none, world 2.

Modes: none; nvme (offload_optimizer nvme: the moments, and with bf16 the fp32 masters);
nvme+param (offload_param nvme too: the param shards, which with fp32 are the masters).
Each mode runs in fresh processes (one per rank, gloo on 127.0.0.1, one intra-op thread), so
ru_maxrss is that run's own peak; a sampler thread also records the peak while training only
(the saving is taken from that one). The model is built under zerolite.zero.Init. ZeRO-3, AdamW, --precision fp32 or bf16, a GPT of
--d-model/--layers.

    PYTHONPATH=. python benchmarks/offload_nvme.py --nvme-path /tmp/zl-swap \
        --modes none,nvme,nvme+param --out benchmarks/results/offload_nvme_fp32.json
    PYTHONPATH=. python benchmarks/offload_nvme.py --precision bf16 --modes none,nvme,nvme+param \
        --out benchmarks/results/offload_nvme_bf16.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

MIB = 2 ** 20


def _worker(args) -> dict:
    import psutil
    import torch
    import torch.distributed as dist

    import zerolite
    from zerolite.models import GPT, GPTConfig
    from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer
    from zerolite.offload.param_swap import ParamFiles
    from zerolite.offload.plan import OffloadPlan

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=2)
    base_rss = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=64, n_layer=args.layers, n_head=8,
                    d_model=args.d_model)
    with zerolite.zero.Init():  # as a user of a large model builds it: no full copy per rank
        model = GPT(cfg)
    zero = {"stage": 3}
    if args.mode != "none":
        zero.update(offload_optimizer={"device": "nvme", "nvme_path": args.nvme_path},
                    sub_group_size=args.sub_group_size)
    if args.mode == "nvme+param":
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.nvme_path}
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
          "bf16": {"enabled": args.precision == "bf16"},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "gradient_clipping": 1.0, "zero_optimization": zero, "steps_per_print": 10 ** 9}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=ds)
    proc = psutil.Process()
    gc.collect()
    after_init = proc.memory_info().rss
    peak, sampling = [after_init], [True]

    from zerolite.host_memory import heap_counters

    heap, at_peak = heap_counters(), {}

    def sample():  # peak RSS while training only (ru_maxrss also covers the start-up)
        while sampling[0]:
            rss = proc.memory_info().rss
            if rss > peak[0]:
                peak[0] = rss
                at_peak.update({f"{k}_mib": v / MIB for k, v in (heap() if heap else {}).items()})
            time.sleep(0.005)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    g = torch.Generator().manual_seed(args.rank)
    times, io = [], []
    plan = engine.placement_plan
    files = plan.param_files if isinstance(plan, OffloadPlan) else None
    swaps = [o.offload_stats for o in (engine.basic_optimizer, files)
             if isinstance(o, (ChunkedOffloadOptimizer, ParamFiles))]

    def moved():
        stats = [f() for f in swaps]
        return {k: sum(s[k] for s in stats) for k in ("bytes_read", "bytes_written")}
    for _ in range(args.steps):
        x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
        before = moved()
        start = time.perf_counter()
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        after = moved()
        io.append({k: after[k] - before[k] for k in after})
    sampling[0] = False
    sampler.join()
    mem = engine.memory_stats()
    out = {"rank": args.rank, "params": cfg.num_params(),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "rss_after_init_mib": after_init / MIB, "peak_rss_training_mib": peak[0] / MIB,
           "base_rss_mib": base_rss / MIB, "step_s": times, "glibc_at_peak": at_peak,
           "optimizer_state_in_ram_mib": mem["optimizer_state"] / MIB,
           "master_shards_in_ram_mib": mem["master_shards"] / MIB,
           "param_shards_in_ram_mib": mem["param_shards"] / MIB}
    if swaps:
        out.update(io_per_step=io, disk_mib=sum(f()["disk_bytes"] for f in swaps) / MIB,
                   chunk_buffers_mib=engine.basic_optimizer.offload_stats()["buffer_bytes"] / MIB)
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
            "--nvme-path", a.nvme_path, "--precision", a.precision]


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
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--modes", default="none,nvme", help="comma list of none, nvme, nvme+param")
    p.add_argument("--mode", choices=("none", "nvme", "nvme+param"))
    p.add_argument("--rank", type=int)
    p.add_argument("--result")
    args = p.parse_args()
    if args.worker:
        res = _worker(args)
        with open(args.result, "w") as f:
            json.dump(res, f)
        os._exit(0)  # skip process-group teardown
    report = {"config": vars(args) | {"world_size": 2, "stage": 3,
                                      "malloc_env": {k: v for k, v in os.environ.items()
                                                     if k.startswith("MALLOC_")}},
              "note": "shared 2-core machine; timings are noisy, compare ratios of one run"}
    modes = args.modes.split(",")
    for mode in modes:
        report[mode] = _run_mode(mode, args)
    steady = lambda r: sum(r["step_s"][1:]) / max(1, len(r["step_s"]) - 1)  # noqa: E731
    base = report[modes[0]]
    report["summary"] = {
        "params": base[0]["params"],
        "adam_moments_per_rank_mib": 8 * base[0]["params"] / 2 / MIB,
        "peak_rss_mib": {m: [r["peak_rss_mib"] for r in report[m]] for m in modes},
        "rss_after_init_mib": {m: [r["rss_after_init_mib"] for r in report[m]] for m in modes},
        "peak_rss_training_mib": {m: [r["peak_rss_training_mib"] for r in report[m]]
                                  for m in modes},
        f"peak_rss_saved_vs_{modes[0]}_mib": {
            m: [a["peak_rss_training_mib"] - b["peak_rss_training_mib"]
                for a, b in zip(base, report[m])]
            for m in modes[1:]},
        "in_ram_mib (optimizer state, masters, param shards)": {
            m: [[r["optimizer_state_in_ram_mib"], r["master_shards_in_ram_mib"],
                 r["param_shards_in_ram_mib"]] for r in report[m]] for m in modes},
        "steady_step_s": {m: [steady(r) for r in report[m]] for m in modes},
        f"step_time_ratio_vs_{modes[0]}": {
            m: [steady(b) / steady(a) for a, b in zip(base, report[m])] for m in modes[1:]},
        "disk_mib_per_step_read_written": {
            m: [[r["io_per_step"][-1]["bytes_read"] / MIB,
                 r["io_per_step"][-1]["bytes_written"] / MIB] for r in report[m]]
            for m in modes if "io_per_step" in report[m][0]},
    }
    text = json.dumps(report, indent=1)
    print(json.dumps(report["summary"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
