"""Activation checkpointing with DeepSpeed's interface (`deepspeed.checkpointing`).

    import zerolite.checkpointing as checkpointing     # deepspeed.checkpointing
    checkpointing.configure(None, deepspeed_config=args.deepspeed_config)
    x = checkpointing.checkpoint(block, x)

`checkpoint` is `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`.

[Note: why non-reentrant] The non-reentrant variant recomputes the block inside the
ongoing backward, when autograd first needs one of its saved tensors. The recompute calls
the block's modules again, so zerolite's forward pre-hooks run: at stage 3 they see
`sharded.in_backward` and re-gather the unit (whose params were released after the original
forward); the unit is released again after its backward as usual. It also keeps gradients
flowing to parameters without requiring inputs that need grad, and honours kwargs, which the
reentrant variant does not.

DeepSpeed's activation partitioning across model-parallel ranks, contiguous buffers and CPU
checkpointing are model-parallel / GPU-memory features zerolite does not have: `configure`
accepts them and logs that they are ignored.
"""
from __future__ import annotations

import json
import logging
import os

import torch
import torch.utils.checkpoint

logger = logging.getLogger("zerolite")

_CONFIG: dict | None = None

# DeepSpeed's "activation_checkpointing" JSON keys -> configure() argument names.
_JSON_KEYS = {
    "partition_activations": "partition_activations",
    "contiguous_memory_optimization": "contiguous_checkpointing",
    "number_checkpoints": "num_checkpoints",
    "cpu_checkpointing": "checkpoint_in_cpu",
    "synchronize_checkpoint_boundary": "synchronize",
    "profile": "profile",
}


def checkpoint(function, *args, **kwargs):
    """Run `function(*args, **kwargs)` without keeping its activations; recompute them in
    backward (DeepSpeed's `deepspeed.checkpointing.checkpoint`)."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)


def _read_ds_config(deepspeed_config) -> dict:
    if deepspeed_config is None:
        return {}
    if isinstance(deepspeed_config, (str, os.PathLike)):
        with open(deepspeed_config) as f:
            deepspeed_config = json.load(f)
    if not isinstance(deepspeed_config, dict):  # an already-parsed config object
        deepspeed_config = getattr(deepspeed_config, "raw", None) or {}
    section = deepspeed_config.get("activation_checkpointing") or {}
    return {_JSON_KEYS[k]: v for k, v in section.items() if k in _JSON_KEYS}


def configure(mpu_, deepspeed_config=None, partition_activations=None,
              contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
              synchronize=None, profile=None) -> None:
    """Accept DeepSpeed's activation-checkpointing settings.

    `deepspeed_config` (a JSON path or dict) supplies its "activation_checkpointing"
    section; explicit arguments override it. None of the settings changes what `checkpoint`
    does (see the module docstring); the ones that are switched on are logged as ignored.
    `mpu_` (model parallelism) must be None.
    """
    global _CONFIG
    if mpu_ is not None:
        logger.warning("zerolite.checkpointing.configure: mpu_ is ignored (no model parallelism)")
    settings = _read_ds_config(deepspeed_config)
    explicit = dict(partition_activations=partition_activations,
                    contiguous_checkpointing=contiguous_checkpointing,
                    num_checkpoints=num_checkpoints, checkpoint_in_cpu=checkpoint_in_cpu,
                    synchronize=synchronize, profile=profile)
    settings.update({k: v for k, v in explicit.items() if v is not None})
    ignored = sorted(k for k, v in settings.items() if v not in (None, False))
    if ignored:
        logger.info("zerolite.checkpointing: ignoring %s (plain non-reentrant activation "
                    "checkpointing is used)", ", ".join(ignored))
    _CONFIG = settings


def is_configured() -> bool:
    """True once `configure` has been called (and not `reset`)."""
    return _CONFIG is not None


def reset() -> None:
    """Forget the configuration (DeepSpeed frees its contiguous buffers here; we have none)."""
    global _CONFIG
    _CONFIG = None


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed torch (and CUDA where present). Without model parallelism every rank uses `seed`."""
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
