"""`initialize`: DeepSpeed's entry point, returning (engine, optimizer, dataloader, scheduler)."""
from __future__ import annotations

import logging
import os

import torch.distributed as dist
import torch.nn as nn

from zerolite import watchdog
from zerolite.comm.process_group import init_distributed
from zerolite.config import accepted_ignored_keys, load_config
from zerolite.engine import ZeroEngine
from zerolite.errors import ZeroliteConfigError

logger = logging.getLogger("zerolite")


def guess_hidden_size(model: nn.Module) -> int | None:
    """The model's hidden size where it says so (for Hugging Face "auto" config values)."""
    for attr in ("hidden_size", "d_model", "n_embd"):
        for holder in (getattr(model, "config", None), getattr(model, "cfg", None), model):
            value = getattr(holder, attr, None) if holder is not None else None
            if isinstance(value, int):
                return value
    return None


class MissingModelError(ZeroliteConfigError, AssertionError):
    """initialize() without a model (DeepSpeed asserts, so this is an AssertionError too)."""


def initialize(args=None, model: nn.Module | None = None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port: int = 29500, mpu=None,
               dist_init_required: bool | None = None, collate_fn=None, config=None,
               config_params=None, unit_policy=None, separate_host: bool = False):
    """Wrap `model` in a ZeroEngine, as `deepspeed.initialize` does.

    `config` is a path to a DeepSpeed JSON file or a dict (`config_params` is DeepSpeed's
    older name for it; `args.deepspeed_config` also works). `separate_host` (zerolite's own,
    for tests and debugging): with offload 'cpu', keep separate host copies even when the
    device is the CPU, so the host hand-off runs for real. Joins the process group if none
    exists (torchrun's env vars; gloo on CPU, nccl on CUDA). Returns
    `(engine, optimizer, training_dataloader, lr_scheduler)`.
    """
    if model is None:  # before joining any process group, as DeepSpeed's assert
        raise MissingModelError("deepspeed.initialize requires a model: initialize(model=...) "
                                "needs the torch.nn.Module to train")
    if not isinstance(model, nn.Module):
        raise ZeroliteConfigError(f"initialize(model=...): expected a torch.nn.Module, got "
                                  f"{type(model).__name__}")
    if mpu is not None:
        raise ZeroliteConfigError("initialize(mpu=...): model parallelism is not supported")
    on_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if on_meta:
        raise ZeroliteConfigError(
            f"initialize(model=...): {len(on_meta)} parameter(s) are on the meta device and hold "
            f"no values ({', '.join(on_meta[:5])}{', ...' if len(on_meta) > 5 else ''}); "
            "materialise them first (module.to_empty(device=...) and load or initialise the "
            "weights; inside zero.Init, to_empty also partitions them)")
    if config is not None and config_params is not None:
        raise ZeroliteConfigError("initialize(): pass the config once, as config= or "
                                  "config_params=, not both")
    config = config if config is not None else config_params
    _quiet_other_ranks()
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    cfg = load_config(config, world, hidden_size=guess_hidden_size(model), args=args)
    init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required,
                     timeout=cfg.zerolite.comm_timeout_s)
    if dist.get_world_size() != cfg.world_size:
        cfg = load_config(config, dist.get_world_size(), hidden_size=guess_hidden_size(model),
                          args=args)
    watchdog.start(cfg.zerolite, dist.get_rank(), dist.get_world_size())
    ignored = accepted_ignored_keys(cfg)
    if ignored and dist.get_rank() == 0:  # one line per job, not one per rank
        logger.warning("zerolite: these config keys are accepted but have no effect here: %s",
                       ", ".join(ignored))
    engine = ZeroEngine(model, cfg, model_parameters=model_parameters, optimizer=optimizer,
                        lr_scheduler=lr_scheduler, training_data=training_data,
                        collate_fn=collate_fn, unit_policy=unit_policy,
                        separate_host=separate_host)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _quiet_other_ranks() -> None:
    """Rank 0 logs INFO; other ranks only warnings and errors (ZEROLITE_LOG_ALL_RANKS=1 to
    see every rank)."""
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    if rank != 0 and not os.environ.get("ZEROLITE_LOG_ALL_RANKS"):
        logger.setLevel(logging.WARNING)
