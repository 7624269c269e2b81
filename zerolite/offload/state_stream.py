"""Streaming access to one offloaded shard's optimizer state, for checkpoints.

Reading `ChunkedOffloadOptimizer.state[master]` builds the whole shard's state in RAM, the very
memory offload saves; zerolite/checkpoint save.py and load.py use these functions instead,
which read and write the state chunk by chunk. They use the optimizer's chunk bookkeeping and
never run during a step.

[Note: a file of its own] The brief was to append this to chunked_optimizer.py; that file is
at the 400-line limit and its owner is extending it, so it lives beside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from zerolite.errors import ZeroliteStateError
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer


@dataclass(frozen=True)
class ShardEntry:
    """Placeholder for a chunk-shaped state entry (its values stay in the chunks)."""
    dtype: torch.dtype
    shape: tuple[int, ...]


def state_entries(opt: ChunkedOffloadOptimizer, master) -> dict | None:
    """`opt.state[master]` with every chunk-shaped entry replaced by a ShardEntry, in the same
    order; reads no file. None when the shard has no state yet."""
    chunks = opt._by_master.get(master)
    if not chunks or not chunks[0].has_state:
        return None
    opt.refuse_if_torn(master)
    out = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
           for k, v in chunks[0].small.items()}
    for name, dtype in (opt._names or {}).items():
        out[name] = ShardEntry(dtype, tuple(master.shape))
    return out


def read_state_slice(opt: ChunkedOffloadOptimizer, master, name: str, lo: int,
                     out: torch.Tensor) -> None:
    """out[:] = elements [lo, lo + out.numel()) of entry `name` of `master`'s state, read from
    the swap files (or the in-memory chunks) straight into `out` (contiguous, CPU, its dtype)."""
    opt.refuse_if_torn(master)
    hi = lo + out.numel()
    for c in opt._by_master[master]:
        a, b = max(lo, c.lo), min(hi, c.hi)
        if a >= b:
            continue
        dst = out[a - lo:b - lo]
        if c.on_disk:
            opt._files.read(f"{c.key}.{name}", c.slot, a * dst.element_size(), dst)
        else:
            dst.copy_(c.resident[name][a - c.lo:b - c.lo])


def stream_state_in(opt: ChunkedOffloadOptimizer, master, values: dict,
                    dtypes: dict[str, torch.dtype], fill) -> None:
    """Replace `master`'s state chunk by chunk: `values` are the entries that are not
    chunk-shaped (e.g. Adam's step), `dtypes` the chunk-shaped ones; `fill(name, lo, out)`
    must fill `out` with that entry's elements [lo, lo + out.numel()). Uses the step's own
    chunk buffers. Like a step, new values go to the other file slot and the slots flip only
    once every chunk is written: a failure half-way leaves the previous state intact."""
    chunks = opt._by_master.get(master)
    if chunks is None:
        raise KeyError(master)
    opt._learn_names({k: torch.empty(1, dtype=dt) for k, dt in dtypes.items()})
    if set(dtypes) != set(opt._names) or any(opt._names[k] != dt for k, dt in dtypes.items()):
        raise ZeroliteStateError(f"offload_optimizer: state entries {sorted(dtypes)} do not "
                                 f"match the optimizer's {sorted(opt._names)}")
    buffers, resident = opt._pool[0], {}
    for c in chunks:
        part = {k: buffers[k][:c.hi - c.lo] for k in dtypes}
        for k, t in part.items():
            fill(k, c.lo, t)
        if c.on_disk:
            opt._store(c, part, 1 - c.slot)
        else:
            # Note: resident chunks live where the masters do (untested off the CPU: no GPU here).
            resident[id(c)] = {k: t.to(c.view.device, copy=True) for k, t in part.items()}
    for c in chunks:
        if c.on_disk:
            c.slot = 1 - c.slot
        else:
            c.resident = resident[id(c)]
        c.small = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
        c.has_state = True
    opt._torn.discard(master)
