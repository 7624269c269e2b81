"""Turn a sharded zerolite checkpoint into a plain model file, streaming parameter by parameter.

    zerolite consolidate CKPT_DIR OUT_DIR [--tag T] [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]
    python -m zerolite.checkpoint.consolidate CKPT_DIR OUT_DIR ...

Output: `model.safetensors`, or HF-style `model-00001-of-0000N.safetensors` shards plus
`model.safetensors.index.json` when the model is larger than --max-shard-size. Names are the
model's own state_dict names (tied parameters are written once under each name). Peak memory
is about one parameter (plus its cast): the output header is computed from the layout, then
each parameter is read from the rank files' byte ranges and written straight out.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

import torch

from zerolite.checkpoint.errors import ZeroliteCheckpointError
from zerolite.checkpoint.format import (CheckpointFiles, dtype_from_name, read_meta,
                                        resolve_checkpoint)
from zerolite.checkpoint.st_io import StreamingWriter, fsync_dir

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size) -> int:
    """'5GB' -> 5e9 (decimal, as Hugging Face), '500MiB' -> binary; ints pass through."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(size))
    if not m or m.group(2).upper() not in _UNITS:
        raise ZeroliteCheckpointError(f"max_shard_size {size!r}: expected e.g. '5GB', "
                                      "'500MB', '2GiB' or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _open(ckpt_dir, tag) -> CheckpointFiles:
    ckpt = resolve_checkpoint(ckpt_dir, tag)
    if ckpt is None:
        raise ZeroliteCheckpointError(f"{ckpt_dir}: no `latest` file and no tag given; "
                                      "pass tag= (or --tag)")
    files = CheckpointFiles(ckpt, read_meta(ckpt))
    files.check_all()
    return files


def _entries(files: CheckpointFiles):
    """(names, shape, stored dtype, reader) per tensor of the model, in layout order."""
    out = []
    for flat in files.meta["layout"]:
        if flat.get("excluded"):
            continue
        stored = dtype_from_name(flat["dtype"])
        for p in flat["params"]:
            def read(flat=flat, p=p, stored=stored):
                t = torch.empty(p["numel"], dtype=stored)
                files.read_flat_range(flat["key"], "param", p["offset"], t)
                return t.view(tuple(p["shape"]))
            out.append((p["names"], tuple(p["shape"]), stored, read))
    bentry = files.meta["files"].get("buffers")
    if bentry is not None:
        f = files._file(bentry)
        for key in f.keys():
            out.append(([key.removeprefix("buffer/")], f.shape(key), f.dtype(key),
                        lambda key=key, f=f: f.read(key)))
    return out


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def get_fp32_state_dict(ckpt_dir, tag=None) -> dict[str, torch.Tensor]:
    """The full model (fp32 master values) as a state dict; tied names share one tensor."""
    files = _open(ckpt_dir, tag)
    try:
        out = {}
        for names, _, _, read in _entries(files):
            t = _cast(read(), torch.float32)
            for n in names:
                out[n] = t
        return out
    finally:
        files.close()


def load_state_dict_from_checkpoint(model, ckpt_dir, tag=None, strict: bool = True):
    """Load a zerolite checkpoint into a plain (unsharded) model; returns the model."""
    model.load_state_dict(get_fp32_state_dict(ckpt_dir, tag), strict=strict)
    return model


def write_model(out_dir, entries, *, dtype=None, max_shard_size="5GB", metadata=None) -> list[str]:
    """Write entries [(names, shape, dtype, read_fn)] as a (sharded) safetensors model.

    Also used by engine.save_16bit_model. Returns the written file names.
    """
    limit = parse_size(max_shard_size)
    os.makedirs(out_dir, exist_ok=True)
    shards, size = [[]], 0
    for e in entries:
        names, shape, stored, _ = e
        out_dtype = dtype if (dtype is not None and stored.is_floating_point) else stored
        nbytes = math.prod(shape) * torch.empty((), dtype=out_dtype).element_size() * len(names)
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append((e, out_dtype))
        size += nbytes
    n = len(shards)
    fnames = ["model.safetensors"] if n == 1 else \
        [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map, total = {}, 0
    for fname, shard in zip(fnames, shards):
        specs = [(name, od, shape) for (names, shape, _, _), od in shard for name in names]
        path = os.path.join(out_dir, fname)
        w = StreamingWriter(path + ".tmp", specs, {"format": "pt", **(metadata or {})})
        try:
            for (names, shape, _, read), od in shard:
                t = read().to(od)
                for name in names:
                    w.write(name, t)
                    weight_map[name] = fname
                    total += t.numel() * t.element_size()
                del t
            w.close()
        except BaseException:
            w.abort()
            raise
        os.replace(path + ".tmp", path)
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        tmp = os.path.join(out_dir, "model.safetensors.index.json.tmp")
        with open(tmp, "w") as f:
            json.dump(index, f, indent=2)
        os.replace(tmp, os.path.join(out_dir, "model.safetensors.index.json"))
    fsync_dir(out_dir)
    return fnames


def consolidate_checkpoint(ckpt_dir, out_dir, *, tag=None, dtype="fp32",
                           max_shard_size="5GB") -> list[str]:
    """Write the checkpoint's full model to out_dir; returns the file names written."""
    if dtype not in DTYPES:
        raise ZeroliteCheckpointError(f"dtype {dtype!r}: expected one of fp32, bf16, fp16")
    parse_size(max_shard_size)
    files = _open(ckpt_dir, tag)
    try:
        return write_model(out_dir, _entries(files), dtype=DTYPES[dtype],
                           max_shard_size=max_shard_size,
                           metadata={"zerolite_tag": files.meta["tag"]})
    finally:
        files.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zerolite consolidate",
                                 description="Write a zerolite checkpoint as one safetensors "
                                             "model (sharded when large).")
    ap.add_argument("ckpt_dir", help="the save_dir given to save_checkpoint (or a tag dir)")
    ap.add_argument("out_dir")
    ap.add_argument("--tag", default=None, help="checkpoint tag (default: the `latest` file)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--max-shard-size", default="5GB")
    args = ap.parse_args(argv)
    try:
        names = consolidate_checkpoint(args.ckpt_dir, args.out_dir, tag=args.tag,
                                       dtype=args.dtype, max_shard_size=args.max_shard_size)
    except ZeroliteCheckpointError as e:
        print(f"zerolite consolidate: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(names)} file(s) to {args.out_dir}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
