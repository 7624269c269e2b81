"""`deepspeed.utils.zero_to_fp32` over zerolite checkpoints: the full fp32 model from the
per-rank shards (`checkpoint_dir` holds `latest` and the tag folders, as DeepSpeed's)."""
from __future__ import annotations

import os

import torch

from zerolite.checkpoint import consolidate_checkpoint, get_fp32_state_dict


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict:
    """The fp32 state dict (tensors on CPU). `exclude_frozen_parameters` needs the frozen
    flags, which zerolite stores in the layout: frozen params are left out when asked."""
    sd = get_fp32_state_dict(checkpoint_dir, tag)
    if exclude_frozen_parameters:
        from zerolite.checkpoint.consolidate import _open

        files = _open(checkpoint_dir, tag)
        try:
            frozen = {n for flat in files.meta["layout"] if not flat["requires_grad"]
                      for p in flat["params"] for n in p["names"]}
        finally:
            files.close()
        sd = {k: v for k, v in sd.items() if k not in frozen}
    return sd


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization: bool = False, tag=None,
                                               exclude_frozen_parameters: bool = False) -> list:
    """Write the fp32 model into `output_dir`: `model.safetensors` (sharded past
    `max_shard_size`) with `safe_serialization`, else `pytorch_model.bin` as DeepSpeed."""
    if safe_serialization and not exclude_frozen_parameters:
        return consolidate_checkpoint(checkpoint_dir, output_dir, tag=tag, dtype="fp32",
                                      max_shard_size=max_shard_size)
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    os.makedirs(output_dir, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file

        save_file({k: v.contiguous().clone() for k, v in sd.items()},
                  os.path.join(output_dir, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    torch.save(sd, os.path.join(output_dir, "pytorch_model.bin"))
    return ["pytorch_model.bin"]


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Load the consolidated fp32 weights into a plain (unsharded) `model`; returns it."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model
