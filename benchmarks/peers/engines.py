"""One builder per engine. Each returns an Engine whose `step(x, y)` runs forward, backward,
float64-norm clipping (1.0) and AdamW on this rank's slice and returns the local loss."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from benchmarks.peers import workload as W

ENGINES = ("zerolite3", "zerolite2", "fsdp2", "ddp", "deepspeed")


@dataclass
class Engine:
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    comm: Callable[[], dict | None] = lambda: None
    """Per-step communication seconds (exposed = compute thread blocked), or None: n/a."""
    notes: str = ""


def init_process_group(engine: str) -> None:
    if engine == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("DS_BUILD_OPS", "0")
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")


def build(engine: str, model: torch.nn.Module, size: W.Size, dtype: str, world: int) -> Engine:
    micro = size.global_batch // world
    bf16 = dtype == "bf16"
    if engine in ("zerolite3", "zerolite2"):
        return _zerolite(model, micro, bf16, stage=int(engine[-1]))
    if engine == "fsdp2":
        return _fsdp2(model, bf16, world)
    if engine == "ddp":
        return _ddp(model, bf16)
    if engine == "deepspeed":
        return _deepspeed(model, micro, bf16)
    raise ValueError(f"unknown engine {engine!r}; choose from {ENGINES}")


def _ds_style_config(micro: int, bf16: bool, stage: int, block_numel: int) -> dict:
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": W.LR, "betas": list(W.BETAS), "eps": W.EPS,
                                     "weight_decay": W.WEIGHT_DECAY}},
            "gradient_clipping": W.CLIP,
            # Release each block after its forward (like FSDP2's reshard_after_forward): with
            # DeepSpeed's default reuse distance (1e9) a model under ~1B params keeps every
            # block gathered from forward to backward and ZeRO-3 saves no parameter memory.
            # Prefetch one block ahead, as FSDP2 does by default: DeepSpeed's default bucket
            # (5e7 elements) gathers ~7 blocks of the 80M model at the start of backward
            # (+217 MiB) without being faster on this 2-core machine.
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                  "stage3_max_reuse_distance": 0,
                                  "stage3_prefetch_bucket_size": block_numel},
            "bf16": {"enabled": bf16}}


def _block_numel(model) -> int:
    return sum(p.numel() for p in model.blocks[0].parameters())


def _finished_step_stats(engine):
    """This step's StepStats: the engine closes the step itself at its optimizer boundary
    (`engine.last_step_stats`); older engines leave it to the caller (`end_step()`)."""
    stats = engine.sharded.stats
    if hasattr(engine, "last_step_stats"):
        return engine.last_step_stats
    return stats.end_step()


def _zerolite(model, micro, bf16, stage) -> Engine:
    import zerolite

    engine, *_ = zerolite.initialize(model=model, config=_ds_style_config(micro, bf16, stage, _block_numel(model)))
    last = {}

    def step(x, y):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        s = _finished_step_stats(engine)
        last.update(all_gather_s=s.all_gather_s, all_gather_wait_s=s.all_gather_wait_s,
                    reduce_scatter_s=s.reduce_scatter_s,
                    reduce_scatter_wait_s=s.reduce_scatter_wait_s,
                    exposed_s=s.all_gather_wait_s + s.reduce_scatter_wait_s,
                    peak_live_bytes=s.peak_live_bytes)
        return loss.detach().float()

    return Engine(step, comm=lambda: dict(last),
                  notes=f"zero stage {stage}, persistence threshold 0, reuse distance 0, "
                        "fp64 clip norm")


def _fsdp2(model, bf16, world) -> Engine:
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
        loss = model(x, y)
        loss.backward()
        # grads are sharded DTensors: fp64 sum of squares of local shards, all-reduced
        W.clip_fp64_([p.grad.to_local() for p in params if p.grad is not None],
                     distributed=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    return Engine(step, notes="fully_shard per block + root, reshard_after_forward default; "
                              "fp64 clip norm over local shards + all_reduce")


def _ddp(model, bf16) -> Engine:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    opt = W.adamw(ddp.parameters())
    params = list(ddp.parameters())
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def step(x, y):
        with amp():
            loss = ddp(x, y)
        loss.backward()
        W.clip_fp64_([p.grad for p in params])  # grads already averaged: local norm = global
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    return Engine(step, notes="fp32 params" + (" + CPU autocast bf16" if bf16 else "") +
                  "; fp64 clip norm on full grads")


def _deepspeed(model, micro, bf16) -> Engine:
    import deepspeed

    cfg = _ds_style_config(micro, bf16, 3, _block_numel(model))
    cfg["optimizer"]["params"]["torch_adam"] = True  # no C++ op build needed
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)

    def step(x, y):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss.detach().float()

    return Engine(step, notes=f"deepspeed {deepspeed.__version__} ZeRO-3, torch_adam, gloo")
