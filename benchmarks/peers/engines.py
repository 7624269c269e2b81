"""One builder per engine. Each returns an Engine whose `step(x, y)` runs forward, backward,
float64-norm clipping (1.0) and AdamW on this rank's slice and returns the local loss."""
from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from benchmarks.peers import configs as C
from benchmarks.peers import workload as W

ENGINES = ("zerolite3", "zerolite2", "zerolite3_once", "fsdp2", "ddp", "deepspeed")
"""zerolite3_once: zerolite ZeRO-3 with the user's opt-in zerolite.reduce_once_per_step."""


@dataclass
class Engine:
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    comm: Callable[[], dict | None] = lambda: None
    """Per-step communication seconds (exposed = compute thread blocked), or None: n/a."""
    extra_bytes: Callable[[], int] = lambda: 0
    """Bytes per step sent outside Python's collectives (DDP's C++ reducer), computed."""
    notes: str = ""


def init_process_group(engine: str) -> None:
    if engine == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("DS_BUILD_OPS", "0")
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")


def build(engine: str, model: torch.nn.Module, size: W.Size, dtype: str, world: int,
          config: str = "tuned", gas: int = 1) -> Engine:
    """`config` names the cell's DeepSpeed-style JSON (benchmarks/peers/configs.py); each
    rank's slice of the global batch is split into `gas` micro-batches."""
    micro = size.global_batch // world // gas
    bf16 = dtype == "bf16"
    cfg = C.ds_config(config, micro=micro, gas=gas, bf16=bf16, hidden=size.d_model,
                      block_numel=_block_numel(model),
                      stage=2 if engine == "zerolite2" else 3)
    if engine == "zerolite3_once":
        cfg["zerolite"] = {"reduce_once_per_step": True}
    if engine.startswith("zerolite"):
        return _zerolite(model, cfg, gas)
    if engine == "fsdp2":
        return _fsdp2(model, bf16, world, gas)
    if engine == "ddp":
        return _ddp(model, bf16, world, gas)
    if engine == "deepspeed":
        return _deepspeed(model, cfg, gas)
    raise ValueError(f"unknown engine {engine!r}; choose from {ENGINES}")


def _micro_batches(x, y, gas: int):
    n = x.shape[0] // gas
    return [(x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]) for i in range(gas)]


def _engine_step(engine, x, y, gas: int):
    """One optimizer step of a DeepSpeed-style engine: forward/backward/step per micro-batch
    (the engine steps the optimizer at the accumulation boundary); the mean loss."""
    total = 0.0
    for xm, ym in _micro_batches(x, y, gas):
        loss = engine(xm, ym)
        engine.backward(loss)
        engine.step()
        total += loss.detach().float()
    return total / gas


def _block_numel(model) -> int:
    return sum(p.numel() for p in model.blocks[0].parameters())


def _finished_step_stats(engine):
    """This step's StepStats: the engine closes the step itself at its optimizer boundary
    (`engine.last_step_stats`); older engines leave it to the caller (`end_step()`)."""
    stats = engine.sharded.stats
    if hasattr(engine, "last_step_stats"):
        return engine.last_step_stats
    return stats.end_step()


def _zerolite(model, cfg, gas) -> Engine:
    import zerolite

    engine, *_ = zerolite.initialize(model=model, config=cfg)
    last = {}
    counters = (engine.sharded.reducer.bytes_sent, engine.sharded.gatherer.bytes_sent)

    def step(x, y):
        sent0 = sum(sum(c.values()) for c in counters)
        mean_loss = _engine_step(engine, x, y, gas)
        s = _finished_step_stats(engine)
        last.update(all_gather_s=s.all_gather_s, all_gather_wait_s=s.all_gather_wait_s,
                    reduce_scatter_s=s.reduce_scatter_s,
                    reduce_scatter_wait_s=s.reduce_scatter_wait_s,
                    exposed_s=s.all_gather_wait_s + s.reduce_scatter_wait_s,
                    peak_live_bytes=s.peak_live_bytes,
                    own_bytes_sent=sum(sum(c.values()) for c in counters) - sent0)
        return mean_loss

    zc = cfg["zero_optimization"]
    return Engine(step, comm=lambda: dict(last),
                  notes="zero " + ", ".join(f"{k}={v}" for k, v in zc.items())
                  + (" + zerolite.reduce_once_per_step" if "zerolite" in cfg else ""))


def _fsdp2(model, bf16, world, gas) -> Engine:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if bf16 else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # root: embeddings (tied head), ln_f
    opt = W.adamw(model.parameters())  # over DTensor shards
    params = list(model.parameters())

    def step(x, y):
        total = 0.0
        for xm, ym in _micro_batches(x, y, gas):  # FSDP2's default: reduce every micro-step
            loss = model(xm, ym)
            (loss / gas).backward()
            total += loss.detach().float()
        # grads are sharded DTensors: fp64 sum of squares of local shards, all-reduced
        W.clip_fp64_([p.grad.to_local() for p in params if p.grad is not None],
                     distributed=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / gas

    return Engine(step, notes="fully_shard per block + root, reshard_after_forward default; "
                              "fp64 clip norm over local shards + all_reduce")


def _ddp(model, bf16, world, gas) -> Engine:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from benchmarks.peers.wire_count import ddp_bytes_per_sync

    ddp = DDP(model)
    opt = W.adamw(ddp.parameters())
    params = list(ddp.parameters())
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    per_sync = ddp_bytes_per_sync(model, world)

    def step(x, y):
        total = 0.0
        micro = _micro_batches(x, y, gas)
        for i, (xm, ym) in enumerate(micro):
            # Accumulate locally and all-reduce once, as DDP's docs show (no_sync).
            sync = contextlib.nullcontext() if i == len(micro) - 1 else ddp.no_sync()
            with sync:
                with amp():
                    loss = ddp(xm, ym)
                (loss / gas).backward()
            total += loss.detach().float()
        W.clip_fp64_([p.grad for p in params])  # grads already averaged: local norm = global
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / gas

    return Engine(step, extra_bytes=lambda: per_sync,
                  notes="fp32 params" + (" + CPU autocast bf16" if bf16 else "") +
                  "; no_sync on all but the last micro-step; fp64 clip norm on full grads")


def _deepspeed(model, cfg, gas) -> Engine:
    import deepspeed

    cfg = copy.deepcopy(cfg)
    cfg["optimizer"]["params"]["torch_adam"] = True  # no C++ op build needed
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)

    def step(x, y):
        return _engine_step(engine, x, y, gas)

    return Engine(step, notes=f"deepspeed {deepspeed.__version__} ZeRO-3, torch_adam, gloo")
