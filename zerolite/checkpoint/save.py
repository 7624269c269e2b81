"""engine.save_checkpoint: per-rank safetensors + a JSON commit record (see format.py)."""
from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import stat
import uuid

import torch

from zerolite.checkpoint import _dist, state_tree
from zerolite.checkpoint.errors import ZeroliteCheckpointError
from zerolite.checkpoint.tags import agreed_tag
from zerolite.checkpoint.format import (CLIENT_PREFIX, FORMAT, LATEST, META, SCHED_PREFIX,
                                        buffers_file_name, check_tag, dtype_name, flat_key,
                                        rank_file_name)
from zerolite.checkpoint.st_io import LazyTensor, fsync_dir, sha256_file, write_file
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer, ShardEntry
from zerolite.version import __version__

logger = logging.getLogger("zerolite")
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
"""Written into every save_dir, as DeepSpeed's (zerolite/checkpoint/zero_to_fp32.py)."""


# -- what gets saved ----------------------------------------------------------------------
def engine_layout(engine, exclude_frozen: bool = False) -> list[dict]:
    """World-size independent description of every flat buffer (plus its shard size)."""
    out = []
    for unit in engine.sharded.units:
        for pos, flat in enumerate(unit.flats):
            stored = torch.float32 if flat.master is not None else flat.compute_dtype
            out.append({
                "key": flat_key(unit.index, pos), "unit": unit.index, "unit_name": unit.name,
                "flat_index": pos, "numel": flat.numel, "shard_numel": flat.shard_numel,
                "requires_grad": flat.requires_grad, "group_index": flat.group_index,
                "has_master": flat.master is not None, "dtype": dtype_name(stored),
                "excluded": bool(exclude_frozen and not flat.requires_grad),
                "params": [{"names": list(s.names), "shape": list(s.shape), "offset": s.offset,
                            "numel": s.numel, "dtype": dtype_name(stored)} for s in flat.slots],
            })
    return out


def persistent_buffers(module) -> dict[str, torch.Tensor]:
    out = {}
    for prefix, mod in module.named_modules():
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                out[f"{prefix}.{name}" if prefix else name] = buf
    return out


def _optim_state(engine, flat) -> dict:
    """The flat's optimizer state; offloaded shards give placeholders, not tensors (below)."""
    opt = engine.basic_optimizer
    if opt is None or flat.master is None:
        return {}
    if isinstance(opt, ChunkedOffloadOptimizer):
        return opt.state_entries(flat.master) or {}
    return opt.state.get(flat.master, {})


# Note: offloaded state goes from its swap files to the checkpoint through one buffer of this
# many elements per dtype, reused for every tensor of the save (4 MiB for fp32).
_STREAM_ELEMS = 1 << 20


class _OffloadedStream:
    """Produces offloaded state entries for the writer, slice by slice, in bounded buffers."""

    def __init__(self, opt):
        self._opt = opt
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    def lazy(self, master, name: str, entry) -> LazyTensor:
        return LazyTensor(entry.dtype, entry.shape, lambda: self._pieces(master, name, entry))

    def _pieces(self, master, name, entry):
        numel = math.prod(entry.shape)
        buf = self._buffers.get(entry.dtype)
        if buf is None:
            buf = self._buffers[entry.dtype] = torch.empty(min(_STREAM_ELEMS, numel),
                                                           dtype=entry.dtype)
        for lo in range(0, numel, buf.numel()):
            piece = buf[:min(buf.numel(), numel - lo)]
            self._opt.read_state_slice(master, name, lo, piece)
            yield piece


def _rank_tensors(engine, layout) -> tuple[list, dict]:
    """This rank's tensors (views, no copies; offloaded state as LazyTensors that stream from
    the swap files) and per-flat optimizer-state descriptions."""
    tensors, optim_meta = [], {}
    stream = _OffloadedStream(engine.basic_optimizer)
    for entry, flat in zip(layout, engine.sharded.flats):
        if entry["excluded"]:
            continue
        key = entry["key"]
        src = flat.master_value() if flat.master is not None else flat.shard_value()
        tensors.append((f"{key}/param", src))
        desc = {"tensors": {}, "values": {}}
        for name, value in _optim_state(engine, flat).items():
            if isinstance(value, ShardEntry):
                desc["tensors"][name] = "shard"
                tensors.append((f"{key}/optim/{name}", stream.lazy(flat.master, name, value)))
            elif isinstance(value, torch.Tensor):
                kind = "shard" if value.shape == flat.master.shape else "whole"
                desc["tensors"][name] = kind
                tensors.append((f"{key}/optim/{name}", value.detach()))
            else:
                desc["values"][name] = to_jsonable(value, f"optimizer.state[{key}][{name!r}]")
        optim_meta[key] = desc
    return tensors, optim_meta


# -- JSON helpers -------------------------------------------------------------------------
def to_jsonable(value, where: str):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (tuple, list)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}, which is not JSON-serializable")


def rng_state() -> dict:
    state = {"torch_cpu": torch.get_rng_state().tolist(), "python": _py_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def _py_state():
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _versions() -> dict:
    import safetensors

    return {"zerolite": __version__, "torch": torch.__version__,
            "safetensors": safetensors.__version__}


def write_json_atomic(path: str, obj, *, text: str | None = None) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text if text is not None else json.dumps(obj, indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


# -- save ---------------------------------------------------------------------------------
def save_checkpoint(engine, save_dir, *, tag=None, client_state=None, save_latest=True,
                    exclude_frozen_parameters=False):
    """Collective. Returns True. Raises (on every rank together) if any rank fails."""
    if not save_dir:  # "" or None: DeepSpeed's check (it would write into the cwd)
        raise ValueError(f"save_dir must be a non-empty string, got {save_dir!r}")
    rank, world = engine.rank, engine.world_size
    client_state = {} if client_state is None else client_state
    tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
    # 1. Validate everything before writing anything; decide together.
    problem = check_tag(tag)
    bad_state = False
    try:
        client_tree, client_tensors = state_tree.encode(client_state, "client_state")
        sched = engine.lr_scheduler
        sched_tree, sched_tensors = (None, []) if sched is None else \
            state_tree.encode(sched.state_dict(), "lr_scheduler.state_dict()")
    except TypeError as e:
        problem, bad_state = f"save_checkpoint: {e}", True
    except Exception as e:  # noqa: BLE001 - a state_dict() that raises must not hang the others
        problem = f"save_checkpoint: could not read the state to save: {e!r}"
    votes = _dist.all_gather_object((problem, bad_state, tag, uuid.uuid4().hex))
    for r, (err, is_type, _, _) in enumerate(votes):
        if err is not None:
            raise (TypeError if is_type else ZeroliteCheckpointError)(
                err if r == rank else f"rank {r}: {err}")
    tag = agreed_tag([v[2] for v in votes], rank, engine.zerolite_config.checkpoint_tag_validation)
    save_id = votes[0][3]
    ckpt = os.path.join(os.fspath(save_dir), tag)
    layout = engine_layout(engine, exclude_frozen_parameters)
    # As DeepSpeed: under stage 3 every rank saves and gets back its own client_state; under
    # stages 0-2 rank 0's is saved and every rank gets it.
    per_rank_client = engine.config.zero_optimization.stage == 3 and world > 1

    # 2. Every rank writes its file under a fresh name, fsyncs it and re-hashes it from disk.
    fname = rank_file_name(rank, world, save_id)
    err, sha, nbytes, buf_entry, optim_meta = None, None, None, None, {}
    try:
        os.makedirs(ckpt, exist_ok=True)
        tensors, optim_meta = _rank_tensors(engine, layout)
        if per_rank_client or rank == 0:
            tensors += [(f"{CLIENT_PREFIX}{i}", t) for i, t in enumerate(client_tensors)]
        if rank == 0:
            tensors += [(f"{SCHED_PREFIX}{i}", t) for i, t in enumerate(sched_tensors)]
        header = {"format": FORMAT, "save_id": save_id, "tag": tag, "rank": str(rank),
                  "world_size": str(world)}
        sha, nbytes = _write_verified(os.path.join(ckpt, fname), tensors, header)
        if rank == 0:
            bname = buffers_file_name(save_id)
            bufs = [(f"buffer/{k}", v) for k, v in persistent_buffers(engine.module).items()]
            bsha, bsize = _write_verified(os.path.join(ckpt, bname), bufs,
                                          {**header, "rank": "buffers"})
            buf_entry = {"file": bname, "sha256": bsha, "nbytes": bsize}
    except Exception as e:  # noqa: BLE001 - reported collectively below
        err = f"rank {rank} could not write {os.path.join(ckpt, fname)}: {e!r}"
    results = _dist.all_gather_object((err, sha, nbytes, rng_state(), buf_entry, client_tree))
    failed = _dist.first_error([r[0] for r in results])
    if failed:
        _remove_quietly(os.path.join(ckpt, fname))
        raise ZeroliteCheckpointError(f"save_checkpoint({ckpt}) failed; nothing was "
                                      f"committed, `latest` is unchanged: {failed[1]}")

    # 3. Rank 0 commits: meta.json (atomic replace), then clean-up, then `latest`.
    err = None
    if rank == 0:
        try:
            _write_recovery_scripts(os.fspath(save_dir))
            meta = _meta(engine, tag, save_id, layout, optim_meta, sched_tree, results,
                         exclude_frozen_parameters, per_rank_client)
            write_json_atomic(os.path.join(ckpt, META), meta)
            _remove_stale(ckpt, keep={e["file"] for e in meta["files"]["ranks"]} | {buf_entry["file"]})
            if save_latest:
                write_json_atomic(os.path.join(os.fspath(save_dir), LATEST), None, text=tag)
        except Exception as e:  # noqa: BLE001
            err = f"rank 0 could not commit {ckpt}: {e!r}"
    done = _dist.first_error(_dist.all_gather_object(err))
    if done:
        raise ZeroliteCheckpointError(done[1])
    logger.info("saved checkpoint %s (%d ranks)", ckpt, world)
    return True


def _write_verified(path: str, tensors, header) -> tuple[str, int]:
    tmp = f"{path}.tmp"
    sha, nbytes = write_file(tmp, tensors, header)
    if sha256_file(tmp) != sha:
        _remove_quietly(tmp)
        raise ZeroliteCheckpointError(f"{tmp}: read-back sha256 differs from what was written")
    os.replace(tmp, path)
    return sha, nbytes


def _meta(engine, tag, save_id, layout, optim_meta, sched_tree, results, exclude_frozen,
          per_rank_client):
    world = engine.world_size
    opt = engine.basic_optimizer
    groups = None
    if opt is not None:
        groups = [to_jsonable({k: v for k, v in g.items() if k != "params"},
                              f"optimizer.param_groups[{i}]")
                  for i, g in enumerate(opt.param_groups)]
    scaler = getattr(engine, "loss_scaler", None)
    client_trees = [r[5] for r in results]
    return {
        "format": FORMAT, "save_id": save_id, "tag": tag, "world_size": world,
        "zero_stage": engine.config.zero_optimization.stage,
        "compute_dtype": dtype_name(engine.sharded.compute_dtype),
        "global_steps": engine.global_steps, "global_samples": engine.global_samples,
        "micro_steps": engine.micro_steps, "skipped_steps": engine.skipped_steps,
        "optimizer": None if opt is None else {"class": type(opt).__name__,
                                                "param_groups": groups, "state": optim_meta},
        "lr_scheduler": sched_tree,
        "loss_scaler": None if scaler is None else to_jsonable(scaler.state_dict(), "loss_scaler"),
        "rng": [r[3] for r in results],
        "config": engine.config.to_dict(),
        "versions": _versions(),
        "client_state": client_trees[0],
        # Stage 3 only: per rank, its own tree where it differs from rank 0's (None: the same
        # tree, its tensors still in that rank's file). Absent (None): rank 0's for everyone.
        "client_state_ranks": [None if t == client_trees[0] else t for t in client_trees]
        if per_rank_client else None,
        "exclude_frozen_parameters": exclude_frozen,
        "layout": layout,
        "files": {"ranks": [{"file": rank_file_name(r, world, save_id), "sha256": res[1],
                             "nbytes": res[2]} for r, res in enumerate(results)],
                  "buffers": results[0][4]},
    }


def _write_recovery_scripts(save_dir: str) -> None:
    """As DeepSpeed 0.19, leave `zero_to_fp32.py` and `zero_to_torch.py` beside `latest`
    (ours: the files of the same names here)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for script in RECOVERY_SCRIPTS:
        dst = os.path.join(save_dir, script)
        tmp = f"{dst}.tmp-{os.getpid()}"
        shutil.copyfile(os.path.join(here, script), tmp)
        os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IEXEC)
        os.replace(tmp, dst)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _remove_stale(ckpt: str, keep: set[str]) -> None:
    """After the commit: drop files of earlier saves of this tag and leftovers of crashes."""
    for name in os.listdir(ckpt):
        if name in keep or name == META:
            continue
        if name.endswith(".safetensors") or ".safetensors.tmp" in name or ".tmp-" in name:
            _remove_quietly(os.path.join(ckpt, name))
