"""Checkpoint save / load / consolidation of a ~350M-parameter GPT at world size 2.

Training is skipped: the engine is built, the optimizer state is created with one step on
zero gradients (so rank files hold master + exp_avg + exp_avg_sq, 12 bytes per parameter),
then saved and loaded back. Consolidation runs in a fresh subprocess whose peak RSS above
its post-import baseline is compared with the target
    peak <= 1.5 x (largest tensor + output shard size).
"""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.slow

CFG = dict(vocab_size=50304, seq_len=1024, n_layer=24, n_head=16, d_model=1024)

_PROBE = r"""
import json, resource, sys, threading, time
import psutil
from zerolite.checkpoint import consolidate_checkpoint
proc = psutil.Process()
base = proc.memory_info().rss
peak = [base]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.005)
t = threading.Thread(target=sample, daemon=True); t.start()
t0 = time.perf_counter()
files = consolidate_checkpoint(sys.argv[1], sys.argv[2], max_shard_size=sys.argv[3])
dt = time.perf_counter() - t0
stop.set(); t.join()
maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": dt, "baseline": base, "peak_sampled": peak[0],
                  "peak_maxrss": maxrss, "files": files}))
"""


def _save_load(rank, world, save_dir):
    import zerolite
    from zerolite.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**CFG))
    nparams = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    cfg = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 3}}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for f in engine.sharded.flats:
        f.master.grad = torch.zeros_like(f.master)
    engine.basic_optimizer.step()  # fills the optimizer state the save writes
    torch.distributed.barrier()
    t0 = time.perf_counter()
    engine.save_checkpoint(save_dir, tag="bench")
    t_save = time.perf_counter() - t0
    torch.distributed.barrier()
    t0 = time.perf_counter()
    engine.load_checkpoint(save_dir)
    t_load = time.perf_counter() - t0
    return nparams, largest, t_save, t_load


def test_checkpoint_save_load_consolidate(benchmark, tmp_path):
    from zerolite.testing.multiprocess import run_ranks

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    res = run_ranks(_save_load, 2, ckpt, timeout_s=900, comm_timeout_s=600)
    nparams, largest = res[0][0], res[0][1]
    t_save = max(r[2] for r in res)
    t_load = max(r[3] for r in res)
    ckpt_bytes = sum(os.path.getsize(os.path.join(ckpt, "bench", f))
                     for f in os.listdir(os.path.join(ckpt, "bench")))

    probe = {}

    def consolidate():
        r = subprocess.run([sys.executable, "-c", _PROBE, ckpt, out, "5GB"],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        probe.update(json.loads(r.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(consolidate, rounds=1, iterations=1)
    out_bytes = max(os.path.getsize(os.path.join(out, f)) for f in probe["files"])
    peak = max(probe["peak_sampled"], probe["peak_maxrss"]) - probe["baseline"]
    target = 1.5 * (largest * 4 + out_bytes)
    mib = 1 << 20
    info = {
        "params": nparams, "world_size": 2,
        "model_fp32_mib": round(nparams * 4 / mib, 1),
        "checkpoint_mib": round(ckpt_bytes / mib, 1),
        "save_s": round(t_save, 2), "load_s": round(t_load, 2),
        "consolidate_s": round(probe["seconds"], 2),
        "largest_tensor_mib": round(largest * 4 / mib, 1),
        "output_shard_mib": round(out_bytes / mib, 1),
        "consolidate_peak_rss_above_baseline_mib": round(peak / mib, 1),
        "target_peak_mib": round(target / mib, 1),
        "peak_over_model_size": round(peak / (nparams * 4), 3),
    }
    benchmark.extra_info.update(info)
    print(json.dumps(info, indent=1))
    assert nparams >= 300_000_000
    assert peak <= target
