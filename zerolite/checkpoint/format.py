"""On-disk layout of a zerolite checkpoint, and reading it back (verified, any world size).

    SAVE_DIR/latest                                   the newest complete tag (text)
    SAVE_DIR/TAG/meta.json                            the commit record (JSON, see below)
    SAVE_DIR/TAG/zero_rank00000-of-00002.<id>.safetensors   rank 0's shards
    SAVE_DIR/TAG/module_buffers.<id>.safetensors     the module's persistent buffers

Rank files hold, per flat buffer `unit{U}/flat{F}`: `.../param` (the fp32 master shard, or
the compute-dtype shard of an unoptimized flat) and `.../optim/{state}` (optimizer state
tensors), plus the tensors of client_state (`client/{i}`) and, in rank 0's, of the
scheduler's state (`lr_scheduler/{i}`). meta.json holds the layout (every parameter's names,
shape, dtype, unit, flat index and offset), the world size, engine counters, scheduler /
loss-scaler / RNG state, the config, versions, client_state (state_tree.py: JSON trees whose
tensor nodes point into the rank files) and, for every file, its sha256 and size. Each file's
safetensors header repeats the save id, tag and rank, so files from two saves are never mixed.

[Note: meta.json is the commit] File names carry the save id, so re-saving a tag never
overwrites the files the current meta.json points to. meta.json is replaced (os.replace)
only after every rank has written, fsynced and re-hashed its file, and old files are
deleted only after that. A crash at any moment leaves the tag either fully old or fully new.
"""
from __future__ import annotations

import json
import os
import re

import torch

from zerolite.checkpoint.errors import ZeroliteCheckpointError
from zerolite.checkpoint.st_io import SafetensorsFile, sha256_file

FORMAT = "zerolite-checkpoint/1"
META = "meta.json"
LATEST = "latest"
CLIENT_PREFIX = "client/"
SCHED_PREFIX = "lr_scheduler/"
_TAG_BAD = re.compile(r"[/\\\x00]")


def flat_key(unit_index: int, flat_pos: int) -> str:
    return f"unit{unit_index}/flat{flat_pos}"


def rank_file_name(rank: int, world: int, save_id: str) -> str:
    return f"zero_rank{rank:05d}-of-{world:05d}.{save_id[:12]}.safetensors"


def buffers_file_name(save_id: str) -> str:
    return f"module_buffers.{save_id[:12]}.safetensors"


def check_tag(tag) -> str | None:
    if not isinstance(tag, str) or not tag or tag.startswith(".") or _TAG_BAD.search(tag):
        return (f"checkpoint tag {tag!r} is not usable as a directory name (non-empty, no "
                "slashes, not starting with '.')")
    return None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ZeroliteCheckpointError(f"unknown dtype {name!r} in checkpoint metadata")
    return dtype


def list_tags(save_dir) -> list[str]:
    try:
        entries = sorted(os.listdir(save_dir))
    except OSError:
        return []
    return [e for e in entries if os.path.isfile(os.path.join(save_dir, e, META))]


def read_latest(save_dir) -> str | None:
    path = os.path.join(save_dir, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip() or None


def resolve_checkpoint(path, tag=None) -> str | None:
    """The tag directory: `path/tag`, `path/<latest>`, or `path` itself if it is a tag dir.

    Returns None when tag is None and there is no `latest` file (DeepSpeed's behaviour).
    """
    path = os.fspath(path)
    if tag is None:
        if os.path.isfile(os.path.join(path, META)):
            return path
        tag = read_latest(path)
        if tag is None:
            return None
    tag = str(tag)
    ckpt = os.path.join(path, tag)
    if not os.path.isfile(os.path.join(ckpt, META)):
        what = "is missing its meta.json (an incomplete save?)" if os.path.isdir(ckpt) \
            else "does not exist"
        raise ZeroliteCheckpointError(
            f"checkpoint tag {tag!r} in {path} {what}; complete tags present: "
            f"{list_tags(path) or 'none'}")
    return ckpt


def read_meta(ckpt: str) -> dict:
    path = os.path.join(ckpt, META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ZeroliteCheckpointError(f"{path}: cannot read checkpoint metadata ({e})") from None
    if meta.get("format") != FORMAT:
        raise ZeroliteCheckpointError(f"{path}: format {meta.get('format')!r} is not "
                                      f"{FORMAT!r}; not a zerolite checkpoint")
    return meta


class CheckpointFiles:
    """Verified, lazily opened rank files of one checkpoint, and reads across them."""

    def __init__(self, ckpt: str, meta: dict):
        self.ckpt, self.meta = ckpt, meta
        self.world = meta["world_size"]
        self.flats = {f["key"]: f for f in meta["layout"]}
        self._open: dict[str, SafetensorsFile] = {}

    def path(self, entry: dict) -> str:
        return os.path.join(self.ckpt, entry["file"])

    def rank_entry(self, rank: int) -> dict:
        return self.meta["files"]["ranks"][rank]

    def check(self, entry: dict, *, rank: int | None, hash_it: bool) -> None:
        """Raise ZeroliteCheckpointError unless the file is present, whole and ours."""
        path = self.path(entry)
        if not os.path.isfile(path):
            raise ZeroliteCheckpointError(
                f"{path}: missing (rank file {entry['file']} of the {self.world}-rank "
                f"checkpoint {self.ckpt})")
        size = os.path.getsize(path)
        if size != entry["nbytes"]:
            raise ZeroliteCheckpointError(f"{path}: {size} bytes, meta.json records "
                                          f"{entry['nbytes']}; the file is truncated or replaced")
        with SafetensorsFile(path) as st:
            got = st.metadata
        want = {"save_id": self.meta["save_id"], "tag": self.meta["tag"]}
        if rank is not None:
            want["rank"] = str(rank)
        diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
        if diff:
            raise ZeroliteCheckpointError(
                f"{path}: belongs to a different save (file has save_id={got.get('save_id')!r} "
                f"tag={got.get('tag')!r} rank={got.get('rank')!r}; meta.json expects "
                f"save_id={self.meta['save_id']!r} tag={self.meta['tag']!r}); files from two "
                "checkpoints are mixed")
        if hash_it:
            digest = sha256_file(path)
            if digest != entry["sha256"]:
                raise ZeroliteCheckpointError(
                    f"{path}: sha256 {digest[:16]}... does not match meta.json "
                    f"({entry['sha256'][:16]}...); the file is corrupted")

    def check_all(self, hash_ranks=None) -> None:
        """Cheap checks on every file; hash the rank files in `hash_ranks` (all if None)."""
        for r in range(self.world):
            self.check(self.rank_entry(r), rank=r,
                       hash_it=hash_ranks is None or r in hash_ranks)
        buf = self.meta["files"].get("buffers")
        if buf is not None:
            self.check(buf, rank=None, hash_it=True)

    def _file(self, entry) -> SafetensorsFile:
        name = entry["file"]
        if name not in self._open:
            self._open[name] = SafetensorsFile(self.path(entry))
        return self._open[name]

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def ranks_for(self, key: str, lo: int, hi: int) -> range:
        s = self.flats[key]["shard_numel"]
        return range(lo // s, (hi - 1) // s + 1) if hi > lo else range(0)

    def read_flat_range(self, key: str, tensor: str, lo: int, out: torch.Tensor) -> None:
        """out[:] = elements [lo, lo+len(out)) of the full (unsharded) flat `key`/`tensor`."""
        s = self.flats[key]["shard_numel"]
        pos, end = lo, lo + out.numel()
        while pos < end:
            r = pos // s
            take = min(end, (r + 1) * s) - pos
            dst = out[pos - lo:pos - lo + take]
            f = self._file(self.rank_entry(r))
            name = f"{key}/{tensor}"
            if f.dtype(name) == dst.dtype:
                f.read_into(name, pos - r * s, dst)
            else:
                tmp = torch.empty(take, dtype=f.dtype(name))
                f.read_into(name, pos - r * s, tmp)
                dst.copy_(tmp)
            pos += take

    def read_small(self, rank: int, name: str) -> torch.Tensor:
        return self._file(self.rank_entry(rank)).read(name)

    def buffers(self) -> dict[str, torch.Tensor]:
        entry = self.meta["files"].get("buffers")
        if entry is None:
            return {}
        f = self._file(entry)
        return {k.removeprefix("buffer/"): f.read(k) for k in f.keys()}


def param_index(meta: dict) -> dict[str, tuple[dict, dict]]:
    """name -> (flat entry, param entry) for every name of every saved parameter."""
    out = {}
    for flat in meta["layout"]:
        if flat.get("excluded"):
            continue
        for p in flat["params"]:
            for name in p["names"]:
                out[name] = (flat, p)
    return out
