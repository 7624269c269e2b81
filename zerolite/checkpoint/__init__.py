"""Checkpoints as data: per-rank safetensors + JSON metadata, resharded on load, consolidatable.

Public API:
    save_checkpoint / load_checkpoint           (called by ZeroEngine.save/load_checkpoint)
    consolidated_16bit_state_dict / save_16bit_model   (engine, collective)
    consolidate_checkpoint / get_fp32_state_dict / load_state_dict_from_checkpoint  (offline)

Guarantees (see format.py for the file layout):
  * A save commits atomically: meta.json is replaced only after every rank's file is written,
    fsynced and re-hashed; `latest` is updated after that. A crash or kill at any point leaves
    the previous checkpoint and `latest` loadable. Re-saving an existing tag writes new file
    names, so the tag reads as entirely old or entirely new, never a mix.
  * A load verifies every file it reads (present, size, save id, sha256) and all ranks agree
    on the outcome before any collective: bad input raises ZeroliteCheckpointError on every
    rank, never a hang and never a silently wrong model.
  * Any world size loads any other (resharding from the layout, flat by flat).
"""
from __future__ import annotations

import logging
import os

import torch

from zerolite.checkpoint import _dist
from zerolite.checkpoint.consolidate import (consolidate_checkpoint, get_fp32_state_dict,
                                             load_state_dict_from_checkpoint, write_model)
from zerolite.checkpoint.errors import ZeroliteCheckpointError
from zerolite.checkpoint.load import load_checkpoint
from zerolite.checkpoint.save import persistent_buffers, save_checkpoint
from zerolite.comm.collectives import gather_full_flat
from zerolite.watchdog import checkpoint_io

# Note: checkpoint I/O runs with the watchdog's stall check suspended (heartbeats go on).
save_checkpoint = checkpoint_io(save_checkpoint)
load_checkpoint = checkpoint_io(load_checkpoint)

logger = logging.getLogger("zerolite")

__all__ = ["save_checkpoint", "load_checkpoint", "consolidated_16bit_state_dict",
           "save_16bit_model", "consolidate_checkpoint", "get_fp32_state_dict",
           "load_state_dict_from_checkpoint", "ZeroliteCheckpointError"]


def _gathered_params(engine, exclude_frozen: bool):
    """Yield (slot, full compute-dtype flat) flat by flat. Collective: same order everywhere."""
    for flat in engine.sharded.flats:
        if exclude_frozen and not flat.requires_grad:
            continue
        yield flat, gather_full_flat(flat.shard_value(), flat.partitions)


@torch.no_grad()
def consolidated_16bit_state_dict(engine, exclude_frozen_parameters: bool = False) -> dict:
    """Full parameters (compute dtype) and buffers on rank 0, {} elsewhere, on the CPU (as
    DeepSpeed returns them). Collective.

    Note: each flat is gathered on the device and copied out before the next one, so the
    device holds one full flat at a time, never a second copy of the whole model."""
    out = {}
    for flat, full in _gathered_params(engine, exclude_frozen_parameters):
        if engine.rank == 0:
            full = full.to("cpu")
            for s in flat.slots:
                value = s.view(full).clone()
                for name in s.names:
                    out[name] = value
        del full
    if engine.rank == 0:
        for name, buf in persistent_buffers(engine.module).items():
            out[name] = buf.detach().to("cpu", copy=True)
    return out


def save_16bit_model_as_configured(engine, save_dir, save_filename="pytorch_model.bin",
                                   exclude_frozen_parameters=False) -> bool:
    """engine.save_16bit_model: as in DeepSpeed, stage 3 gathers and saves the full model only
    with stage3_gather_16bit_weights_on_model_save; otherwise a warning and False.

    [Note: the file's format follows its name] DeepSpeed torch.saves the state dict, by
    default as `pytorch_model.bin`, whatever the name; zerolite does the same, except that a
    name ending in `.safetensors` gets a safetensors file (streamed flat by flat), which is
    what a reader of such a name expects."""
    zc = engine.zerolite_config.zero_optimization
    if zc.stage == 3 and not zc.stage3_gather_16bit_weights_on_model_save:
        if engine.rank == 0:
            logger.warning("zerolite: save_16bit_model(%s) saved nothing: zero_optimization."
                           "stage3_gather_16bit_weights_on_model_save is false", save_dir)
        return False
    if os.fspath(save_filename).endswith(".safetensors"):
        return save_16bit_model(engine, save_dir, save_filename,
                                exclude_frozen_parameters=exclude_frozen_parameters)
    return _save_16bit_state_dict(engine, save_dir, save_filename, exclude_frozen_parameters)


@checkpoint_io
def _save_16bit_state_dict(engine, save_dir, save_filename, exclude_frozen_parameters) -> bool:
    """DeepSpeed's format: rank 0 torch.saves the full compute-dtype state dict (tied
    parameters under each name, persistent buffers). Collective; returns True."""
    sd = consolidated_16bit_state_dict(engine, exclude_frozen_parameters)
    err = None
    if engine.rank == 0:
        path = os.path.join(os.fspath(save_dir), save_filename)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            os.makedirs(save_dir, exist_ok=True)
            torch.save(sd, tmp)
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 - reported collectively below
            err = f"save_16bit_model({path}): {e!r}"
    failed = _dist.first_error(_dist.all_gather_object(err))
    if failed:
        raise ZeroliteCheckpointError(failed[1])
    return True


@checkpoint_io
@torch.no_grad()
def save_16bit_model(engine, save_dir, save_filename="model.safetensors",
                     exclude_frozen_parameters=False):
    """Rank 0 writes the full compute-dtype model as safetensors, streaming flat by flat.

    Same file format as consolidate_checkpoint's output. Collective; returns True.
    """
    gen = _gathered_params(engine, exclude_frozen_parameters)
    err = None
    if engine.rank == 0:
        # Build entries lazily: each read pulls the next gathered flat from the collective.
        current = {"flat": None, "full": None}
        entries = []
        flats = [f for f in engine.sharded.flats
                 if not (exclude_frozen_parameters and not f.requires_grad)]
        for flat in flats:
            for i, s in enumerate(flat.slots):
                def read(flat=flat, s=s, first=(i == 0)):
                    if first:
                        current["flat"], current["full"] = next(gen)
                    return s.view(current["full"])
                entries.append((list(s.names), tuple(s.shape), flat.shard.dtype, read))
        for name, buf in persistent_buffers(engine.module).items():
            entries.append(([name], tuple(buf.shape), buf.dtype, lambda b=buf: b.detach()))
        tmpdir = os.path.join(os.fspath(save_dir), f".{save_filename}.tmpdir")
        try:
            os.makedirs(save_dir, exist_ok=True)
            write_model(tmpdir, entries, max_shard_size=1 << 62)
            os.replace(os.path.join(tmpdir, "model.safetensors"),
                       os.path.join(os.fspath(save_dir), save_filename))
            os.rmdir(tmpdir)
        except Exception as e:  # noqa: BLE001 - reported collectively below
            err = f"save_16bit_model({save_dir}/{save_filename}): {e!r}"
    for _ in gen:  # finish the collectives (all of them on ranks > 0, leftovers on rank 0)
        pass
    failed = _dist.first_error(_dist.all_gather_object(err))
    if failed:
        raise ZeroliteCheckpointError(failed[1])
    return True
