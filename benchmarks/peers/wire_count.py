"""Count the bytes each rank sends, per engine, by wrapping torch.distributed's Python
collectives (a measurement, applied the same way to every engine; it changes no setting).

Bytes are what the bandwidth-optimal algorithm of each collective sends
(zerolite.comm.wire_bytes): ring all-reduce 2(N-1)/N of the buffer, reduce-scatter and
all_to_all (N-1)/N, all-gather N-1 times this rank's input. DDP reduces from C++ (its
Reducer calls the process group directly), which no Python wrapper sees: its bytes are
computed instead (an all-reduce of every gradient once per synchronised backward).
"""
from __future__ import annotations

import functools
import threading

import torch
import torch.distributed as dist

from zerolite.comm.collectives import wire_bytes

_state = threading.local()
SENT = {"bytes": 0, "calls": 0}


def _nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _world(kwargs) -> int:
    return dist.get_world_size(kwargs.get("group"))


# name -> (kind, index of the tensor argument whose size counts, keyword name)
_WRAPPED = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "all_gather_into_tensor": ("all_gather", 1, "input_tensor"),
    "all_gather_single": ("all_gather", 1, "input_tensor"),
    "all_gather": ("all_gather", 1, "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "reduce_scatter": ("reduce_scatter", 1, "input_list"),
    "all_to_all_single": ("all_to_all", 1, "input"),
}


def _wrap(fn, kind, index, key):
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        if getattr(_state, "inside", False):  # one name implemented by another
            return fn(*args, **kwargs)
        t = args[index] if len(args) > index else kwargs.get(key)
        SENT["bytes"] += wire_bytes(kind, _nbytes(t), _world(kwargs))
        SENT["calls"] += 1
        _state.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            _state.inside = False

    counted.__wire_counted__ = True
    return counted


def install() -> None:
    """Wrap the collectives once per process (before the engine is built)."""
    for name, (kind, index, key) in _WRAPPED.items():
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "__wire_counted__", False):
            continue
        setattr(dist, name, _wrap(fn, kind, index, key))
    # zerolite resolved its all-gather / reduce-scatter names at import: point it at the
    # wrapped ones too.
    from zerolite.comm import collectives as zc

    zc._all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    zc._reduce_scatter_flat = (getattr(dist, "reduce_scatter_single", None)
                               or dist.reduce_scatter_tensor)


def ddp_bytes_per_sync(model: torch.nn.Module, world: int) -> int:
    """DDP: one ring all-reduce of every gradient (its buckets cover all of them)."""
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return wire_bytes("all_reduce", grads, world)
