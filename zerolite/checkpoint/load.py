"""engine.load_checkpoint: verify, then stream each flat's shard in, resharding on the fly.

[Note: resharding is just addressing] A flat's full (unpadded) contents are the
concatenation of the old ranks' shards, whatever the old world size. The new rank r needs
elements [r*S', (r+1)*S') of each flat, so it reads exactly those byte ranges from the one or
two old rank files that hold them, straight into its master / optimizer-state tensors, and
zeroes the padding. Nothing bigger than one flat shard is ever materialized, and no
collective is involved except the up-front error vote and the final param refresh.
With load_module_strict=False the same mapping is done per parameter name, so parameters the
checkpoint lacks keep their values and extra checkpoint parameters are ignored.
"""
from __future__ import annotations

import logging
import os
import random

import torch

from zerolite.checkpoint import _dist, state_tree
from zerolite.checkpoint.errors import ZeroliteCheckpointError
from zerolite.checkpoint.format import (CLIENT_PREFIX, SCHED_PREFIX, CheckpointFiles, flat_key,
                                        param_index, read_meta, resolve_checkpoint)
from zerolite.checkpoint.save import persistent_buffers
from zerolite.compat import DEEPSPEED_API_VERSION
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer
from zerolite.optim.master_update import state_entry_dtype
from zerolite.zero.flat_placement import MasterHome, ShardHome
from zerolite.zero.shard_math import overlap, rank_range

logger = logging.getLogger("zerolite")


def _layout_diff(engine, meta, strict: bool) -> str | None:
    """A readable description of how the model differs from the checkpoint, or None."""
    saved = param_index(meta)
    excluded = {n for f in meta["layout"] if f.get("excluded") for p in f["params"]
                for n in p["names"]}
    model = {}
    for flat in engine.sharded.flats:
        for s in flat.slots:
            for n in s.names:
                model[n] = s.shape
    missing = [n for n in model if n not in saved and n not in excluded]
    unexpected = [n for n in saved if n not in model]
    shapes = [f"{n}: checkpoint {tuple(saved[n][1]['shape'])} vs model {model[n]}"
              for n in model if n in saved and tuple(saved[n][1]["shape"]) != tuple(model[n])]
    parts = []
    if shapes:
        parts.append(f"shape mismatch ({len(shapes)}): {shapes[:5]}")
    if strict and missing:
        parts.append(f"missing in checkpoint ({len(missing)}): {missing[:5]}")
    if strict and unexpected:
        parts.append(f"unexpected in checkpoint ({len(unexpected)}): {unexpected[:5]}")
    if not parts:
        return None
    hint = "" if not strict else "; pass load_module_strict=False to skip missing/unexpected"
    return "model parameters do not match the checkpoint layout: " + "; ".join(parts) + hint


def _plan(engine, meta, strict: bool) -> list[list[tuple[int, int, str, int]]]:
    """Per current flat: pieces (dst_lo, dst_hi, ckpt flat key, src_lo) in flat coordinates."""
    saved = param_index(meta)
    ckpt_layout = {f["key"]: f for f in meta["layout"]}
    plans = []
    for unit in engine.sharded.units:
        for pos, flat in enumerate(unit.flats):
            key = flat_key(unit.index, pos)
            old = ckpt_layout.get(key)
            same = (old is not None and not old.get("excluded") and old["numel"] == flat.numel
                    and [(tuple(p["names"]), tuple(p["shape"]), p["offset"]) for p in old["params"]]
                    == [(s.names, s.shape, s.offset) for s in flat.slots])
            if same:
                plans.append([(0, flat.numel, key, 0)])
                continue
            pieces = []
            for s in flat.slots:
                hit = next((saved[n] for n in s.names if n in saved), None)
                if hit is None:
                    continue
                ofl, op = hit
                if pieces and pieces[-1][2] == ofl["key"] and pieces[-1][1] == s.offset and \
                        pieces[-1][3] + (pieces[-1][1] - pieces[-1][0]) == op["offset"]:
                    lo, _, k, src = pieces[-1]
                    pieces[-1] = (lo, s.offset + s.numel, k, src)
                else:
                    pieces.append((s.offset, s.offset + s.numel, ofl["key"], op["offset"]))
            plans.append(pieces)
    return plans


def _my_range(flat) -> tuple[int, int]:
    return rank_range(flat.rank, flat.shard_numel)


def _needed_ranks(engine, files: CheckpointFiles, plans) -> set[int]:
    need = set()
    for flat, pieces in zip(engine.sharded.flats, plans):
        lo, hi = _my_range(flat)
        for a, b, key, src in pieces:
            part = overlap((a, b), (lo, hi))
            if part is not None:
                need.update(files.ranks_for(key, src + part[0] - a, src + part[1] - a))
    return need


def _fill(files: CheckpointFiles, flat, pieces, tensor_name: str, dst: torch.Tensor,
          start: int = 0) -> None:
    """dst[:] = this rank's shard elements [start, start + dst.numel()) of `tensor_name`."""
    lo, _ = _my_range(flat)
    lo += start
    hi = lo + dst.numel()
    if hi > flat.numel:  # padding
        dst[max(flat.numel - lo, 0):].zero_()
    for a, b, key, src in pieces:
        part = overlap((a, b), (lo, hi))
        if part is not None:
            a2, b2 = part
            files.read_flat_range(key, tensor_name, src + a2 - a, dst[a2 - lo:b2 - lo])


def load_checkpoint(engine, load_dir, *, tag=None, load_module_strict=True,
                    load_optimizer_states=True, load_lr_scheduler_states=True,
                    load_module_only=False):
    """Collective. Returns (load_path, client_state), or (None, None) when tag is None and
    load_dir has no `latest` file (as DeepSpeed)."""
    # 1. Every rank resolves and verifies what it will read; then all decide together.
    err, ckpt, meta, files, plans = None, None, None, None, None
    try:
        ckpt = resolve_checkpoint(load_dir, tag)
        if ckpt is not None:
            meta = read_meta(ckpt)
            diff = _layout_diff(engine, meta, load_module_strict)
            if diff:
                raise ZeroliteCheckpointError(f"{ckpt}: {diff}")
            files = CheckpointFiles(ckpt, meta)
            plans = _plan(engine, meta, load_module_strict)
            client_src, client_tree = _client_tree(engine, meta)
            hash_ranks = _needed_ranks(engine, files, plans)
            if state_tree.has_tensors(client_tree):
                hash_ranks.add(client_src)
            if state_tree.has_tensors(meta.get("lr_scheduler")):
                hash_ranks.add(0)
            files.check_all(hash_ranks=hash_ranks)
            _check_optimizer(engine, meta, load_optimizer_states and not load_module_only, ckpt)
    except ZeroliteCheckpointError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - an unexpected failure must not hang the others
        err = f"{load_dir}: {e!r}"
    votes = _dist.agree(err)
    failed = _dist.first_error(votes)
    if failed:
        if files is not None:
            files.close()
        r, msg = failed
        raise ZeroliteCheckpointError(msg if r == engine.rank else f"rank {r}: {msg}")
    if ckpt is None:
        logger.warning("load_checkpoint: no `latest` file in %s and no tag given; nothing "
                       "loaded (pass tag= to load a specific checkpoint)", load_dir)
        return None, None

    # 2. Stream the tensors in.
    try:
        with torch.no_grad():
            _load_tensors(engine, files, plans,
                          optim=load_optimizer_states and not load_module_only,
                          masters_from_16bit=_masters_from_16bit(engine, load_module_only))
            bufs = files.buffers()
            for name, buf in persistent_buffers(engine.module).items():
                if name in bufs and bufs[name].shape == buf.shape:
                    buf.copy_(bufs[name])
                elif load_module_strict and name not in bufs:
                    logger.warning("load_checkpoint: buffer %s not in checkpoint", name)
            client_state = state_tree.decode(
                client_tree, lambda key: files.read_small(client_src, CLIENT_PREFIX + key))
            sched_state = state_tree.decode(
                meta.get("lr_scheduler"), lambda key: files.read_small(0, SCHED_PREFIX + key))
    finally:
        files.close()
    engine.sharded.refresh_params_from_masters()  # collective for stages 0-2

    # 3. Small state. DeepSpeed does not restore micro_steps (a fresh engine's stays 0);
    # zerolite sets it to 0, which is that, and also puts an engine that loads into itself
    # after a failed step back at the start of an accumulation window.
    if not load_module_only:
        for k in ("global_steps", "global_samples", "skipped_steps"):
            setattr(engine, k, meta[k])
        engine.micro_steps = 0
        if load_optimizer_states and engine.basic_optimizer is not None and meta["optimizer"]:
            _load_param_groups(engine.basic_optimizer, meta["optimizer"]["param_groups"])
        if (load_lr_scheduler_states and engine.lr_scheduler is not None
                and sched_state is not None):
            engine.lr_scheduler.load_state_dict(sched_state)
        scaler = getattr(engine, "loss_scaler", None)
        if scaler is not None and meta.get("loss_scaler") is not None:
            scaler.load_state_dict(meta["loss_scaler"])
        _set_rng(meta["rng"], engine.rank)
    ranks = meta["files"]["ranks"]
    load_path = os.path.join(ckpt, ranks[min(engine.rank, len(ranks) - 1)]["file"])
    return load_path, {**_deepspeed_keys(engine, meta, sched_state, load_optimizer_states,
                                         load_lr_scheduler_states, load_module_only),
                       **(client_state or {})}


def _deepspeed_keys(engine, meta, sched_state, load_optimizer_states,
                    load_lr_scheduler_states, load_module_only) -> dict:
    """The entries of DeepSpeed's model-states file that its load_checkpoint hands back in
    client_state beside the program's own (which win on a clash, as there): what it did not
    restore. zerolite has no flat-buffer shape lists to give (param_shapes, shared_params,
    frozen_param_shapes / _fragments: those describe DeepSpeed's own files)."""
    keys = {"global_samples": meta["global_samples"], "ds_config": meta["config"],
            "ds_version": DEEPSPEED_API_VERSION,
            "buffer_names": list(persistent_buffers(engine.module))}
    if load_module_only:
        keys.update(global_steps=meta["global_steps"], skipped_steps=meta["skipped_steps"],
                    dp_world_size=meta["world_size"], mp_world_size=1)
    if not load_lr_scheduler_states:
        keys["lr_scheduler"] = sched_state
    if not load_optimizer_states:
        keys["optimizer"] = None  # a ZeRO checkpoint's model states hold no optimizer
    return keys


def _client_tree(engine, meta) -> tuple[int, object]:
    """(the rank whose saved client_state this rank gets, that state's tree). Under stage 3
    each rank gets its own, as DeepSpeed; a rank the saving run did not have gets rank 0's."""
    ranks = meta.get("client_state_ranks")
    if not ranks:
        return 0, meta.get("client_state")
    src = engine.rank if engine.rank < len(ranks) else 0
    if engine.rank >= len(ranks) and any(t is not None for t in ranks):
        logger.warning("load_checkpoint: the checkpoint's ranks saved different client_state "
                       "and it has no rank %d; this rank gets rank 0's", engine.rank)
    tree = ranks[src]
    return src, meta.get("client_state") if tree is None else tree


def _check_optimizer(engine, meta, want: bool, ckpt: str) -> None:
    if not want or engine.basic_optimizer is None or not meta.get("optimizer"):
        return
    saved = meta["optimizer"]["param_groups"]
    have = engine.basic_optimizer.param_groups
    if len(saved) != len(have):
        raise ZeroliteCheckpointError(
            f"{ckpt}: checkpoint has {len(saved)} optimizer param groups, the engine has "
            f"{len(have)}; pass load_optimizer_states=False to load weights only")


def _masters_from_16bit(engine, load_module_only: bool) -> bool:
    """Do the fp32 masters take the 16-bit weights' values on this load, as DeepSpeed's do?

    [Note: masters from 16-bit weights] At stages 1-2 in fp16/bf16 DeepSpeed rebuilds its fp32
    masters from the 16-bit weights when zero_optimization.load_from_fp32_weights is false
    (its documented meaning) and with load_module_only (the module file holds the 16-bit
    weights); the saved fp32 values are used otherwise, and always at stage 3 (its stage-3
    load restores the fp32 partitions whatever the flag says). zerolite does the same, so a
    resumed run continues from the values DeepSpeed's would."""
    zc = engine.zerolite_config.zero_optimization
    return (zc.stage in (1, 2) and engine.sharded.compute_dtype != torch.float32
            and (load_module_only or not zc.load_from_fp32_weights))


def _load_tensors(engine, files: CheckpointFiles, plans, optim: bool,
                  masters_from_16bit: bool = False) -> None:
    opt = engine.basic_optimizer
    state_meta = (files.meta.get("optimizer") or {}).get("state", {})
    for flat, pieces in zip(engine.sharded.flats, plans):
        where = flat.placement
        swapped = where.master_home is MasterHome.FILE if flat.master is not None \
            else where.shard.home is ShardHome.FILE
        dst = flat.master.data if flat.master is not None else flat.shard
        if swapped:  # the value lives in offload files: fill a temporary, then write it
            dst = torch.empty(flat.shard_numel, dtype=flat.master.dtype if flat.master is not None
                              else flat.compute_dtype, device=flat.device)
        _fill(files, flat, pieces, "param", dst)
        if masters_from_16bit and flat.master is not None and dst.dtype != flat.compute_dtype:
            dst.copy_(dst.to(flat.compute_dtype))
        if swapped and flat.master is not None:
            flat.write_master(dst)
        elif swapped:
            flat.write_shard(0, dst)
        if not optim or opt is None or flat.master is None:
            continue
        keys = {k for _, _, k, _ in pieces}
        descs = [state_meta.get(k) for k in keys]
        if not pieces or any(d is None for d in descs):
            continue
        if any(not d["tensors"] and not d["values"] for d in descs):
            opt.state.pop(flat.master, None)  # saved before the first step
            continue
        desc = descs[0]
        state = {}
        src_key, src_lo = pieces[0][2], pieces[0][3]
        first_rank = files.ranks_for(src_key, src_lo, src_lo + 1)[0]
        if isinstance(opt, ChunkedOffloadOptimizer):
            _stream_offloaded(opt, files, flat, pieces, desc, src_key, first_rank)
            continue
        have = opt.state.get(flat.master, {})
        for name, kind in desc["tensors"].items():
            if kind == "shard":
                old = have.get(name)
                t = old if isinstance(old, torch.Tensor) and old.shape == dst.shape else \
                    torch.zeros_like(dst, dtype=state_entry_dtype(opt, flat.master, name))
                _fill(files, flat, pieces, f"optim/{name}", t)
                state[name] = t
            else:
                state[name] = files.read_small(first_rank, f"{src_key}/optim/{name}").clone()
        state.update(desc["values"])
        opt.state[flat.master] = state


def _stream_offloaded(opt, files: CheckpointFiles, flat, pieces, desc, src_key,
                      first_rank) -> None:
    """Offloaded state (zerolite.offload) goes from the checkpoint into the swap files chunk
    by chunk, through the optimizer's own chunk buffers: no whole-shard copy in RAM."""
    values = {name: files.read_small(first_rank, f"{src_key}/optim/{name}").clone()
              for name, kind in desc["tensors"].items() if kind != "shard"}
    values.update(desc["values"])
    dtypes = {name: opt.state_entry_dtype(flat.master, name)
              for name, kind in desc["tensors"].items() if kind == "shard"}

    def fill(name: str, lo: int, out: torch.Tensor) -> None:
        out.zero_()  # what the checkpoint does not cover (load_module_strict=False) starts at 0
        _fill(files, flat, pieces, f"optim/{name}", out, start=lo)

    opt.stream_state_in(flat.master, values, dtypes, fill)


def _load_param_groups(opt, saved: list[dict]) -> None:
    for group, hp in zip(opt.param_groups, saved):
        for k, v in hp.items():
            cur = group.get(k)
            if isinstance(cur, tuple) and isinstance(v, list):
                v = tuple(v)
            if isinstance(cur, torch.Tensor):
                cur.fill_(v)
            else:
                group[k] = v


def _set_rng(states: list[dict], rank: int) -> None:
    # Same world size: each rank gets its own stream back. Otherwise reuse old rank r % N.
    s = states[rank % len(states)]
    torch.set_rng_state(torch.tensor(s["torch_cpu"], dtype=torch.uint8))
    if "python" in s:
        v, internal, gauss = s["python"]
        random.setstate((v, tuple(internal), gauss))
    if s.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(x, dtype=torch.uint8) for x in s["cuda"]])
