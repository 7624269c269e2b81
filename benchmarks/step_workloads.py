"""Timed training steps of one GPT under zerolite or DDP, run inside each rank."""
from __future__ import annotations

import resource
import statistics

import psutil
import time

import torch
import torch.distributed as dist

from zerolite.models import GPT, GPTConfig

GPT_20M = GPTConfig(vocab_size=256, seq_len=128, n_layer=11, n_head=6, d_model=384)
GPT_80M = GPTConfig(vocab_size=256, seq_len=128, n_layer=12, n_head=12, d_model=768)


def _batch(cfg: GPTConfig, micro: int, step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    data = torch.randint(0, cfg.vocab_size, (micro, cfg.seq_len + 1), generator=g)
    return data[:, :-1], data[:, 1:]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_steps(rank, world, engine_kind: str, cfg: GPTConfig, micro: int, steps: int,
              warmup: int, stage: int = 3, dtype: str = "fp32", zero: dict | None = None) -> dict:
    torch.manual_seed(0)
    model = GPT(cfg)
    if engine_kind == "zerolite":
        import zerolite

        config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                  "gradient_clipping": 1.0,
                  "zero_optimization": {"stage": stage, **(zero or {})},
                  "bf16": {"enabled": dtype == "bf16"}}
        engine, *_ = zerolite.initialize(model=model, config=config)

        def step(x, y):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            return loss
    elif engine_kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

        def step(x, y):
            loss = ddp(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    else:
        raise ValueError(engine_kind)
    times, comm = [], []
    for i in range(warmup + steps):
        x, y = _batch(cfg, micro, i, rank)
        dist.barrier()
        t0 = time.perf_counter()
        step(x, y)
        dist.barrier()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            if engine_kind == "zerolite":
                comm.append(engine.last_step_stats.as_dict())
    return {"median_step_s": statistics.median(times), "step_times_s": times, "comm": comm,
            "peak_rss_mib": _peak_rss_mib(),
            "rss_after_steps_mib": psutil.Process().memory_info().rss / 2**20, "params": sum(p.numel() for p in GPT(cfg).parameters())}
