"""The engine side of DeepSpeed's tensor-fragment API (`deepspeed.utils.safe_get_full_*` and
friends): one parameter's fp32 master, fp32 gradient or optimizer state, read or written as the
whole tensor or as DeepSpeed's per-parameter local partition (stage 3).

Where the values live: a managed parameter is slot `[offset, offset + numel)` of its unit's
FlatParam, and this rank holds `[rank * shard, (rank + 1) * shard)` of that flat (the master,
its `.grad` and each optimizer-state tensor are all shard-shaped). A parameter's piece on this
rank is the overlap of the two ranges (possibly none). A full read fills each rank's piece
into a zero buffer of the parameter's size and sums over ranks (the pieces are disjoint); a
full write keeps this rank's piece of the value every rank passed.

[Note: the local partition is DeepSpeed's, not the flat's] DeepSpeed partitions each
parameter on its own: rank r's local part is elements `[r * P, (r + 1) * P)` of the flattened
parameter, `P = ceil(numel / world)`, zero padded. zerolite's flats cut units, not parameters,
so that range is not what this rank holds; the local calls derive it from the full value (a
collective) and write it back the same way. Unlike DeepSpeed's, they must be called on every
rank, like the full ones.

Every call is a collective over the ranks except at stage 0, where each rank holds it all.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from zerolite.comm.collectives import all_gather_flat, all_reduce_sum
from zerolite.zero.shard_math import overlap, rank_range, shard_numel

GRADS_UNAVAILABLE = "Gradients are only available immediately after backward and before engine step"
"""DeepSpeed's message (tensor_fragment.py) for a gradient read outside that window."""
ZERO3_ONLY = "This API is only defined for ZeRO-3 partitioned parameters"


class OptimizerStateKeyError(KeyError, ValueError):
    """No optimizer-state entry of that name for the parameter. DeepSpeed raises ValueError at
    stages 1-2 and KeyError at stage 3; this is both."""

    def __str__(self) -> str:
        return str(self.args[0])


class TensorFragments:
    """Reads and writes one managed parameter's fp32 values; built by the engine once its
    optimizer exists and set on each managed parameter as `param.zl_fragments`."""

    def __init__(self, sharded, optimizer):
        self.sharded, self.optimizer = sharded, optimizer
        for flat in sharded.flats:
            for p in flat.params:
                p.zl_fragments = self

    # -- where a parameter's values are ----------------------------------------------------
    @staticmethod
    def _slot(p):
        handle = p.zl_handle
        return handle.flat, handle.flat.slots[handle.index]

    def optimized(self, p) -> bool:
        """Trainable and in the optimizer: the only parameters with fp32 values here (DeepSpeed
        answers None for the others)."""
        flat, _ = self._slot(p)
        return p.requires_grad and flat.master is not None

    def _piece(self, flat, slot):
        """(lo, hi) in this rank's shard and the matching start in the parameter, or None."""
        lo, hi = rank_range(flat.rank, flat.shard_numel)
        both = overlap((slot.offset, slot.offset + slot.numel), (lo, hi))
        return None if both is None else (both[0] - lo, both[1] - lo, both[0] - slot.offset)

    def _assemble(self, p, shard: torch.Tensor | None) -> torch.Tensor:
        """The whole parameter-shaped fp32 tensor from every rank's piece of a shard-shaped
        tensor (None: this rank's piece is zero). Collective unless one partition."""
        flat, slot = self._slot(p)
        out = torch.zeros(slot.numel, dtype=torch.float32, device=flat.device)
        piece = self._piece(flat, slot)
        if piece is not None and shard is not None:
            lo, hi, at = piece
            out[at:at + hi - lo].copy_(shard[lo:hi])
        if flat.partitions > 1:
            all_reduce_sum(out)
        return out.view(slot.shape)

    def _write_piece(self, p, value: torch.Tensor, shard: torch.Tensor) -> None:
        """Copy this rank's piece of the whole `value` into the shard-shaped `shard`."""
        flat, slot = self._slot(p)
        if value.numel() != slot.numel:
            raise AssertionError(f"Number of elements do not match: {value.numel()} != "
                                 f"{slot.numel} (parameter {slot.name!r}, shape {slot.shape})")
        piece = self._piece(flat, slot)
        if piece is not None:
            lo, hi, at = piece
            shard[lo:hi].copy_(value.detach().reshape(-1)[at:at + hi - lo])

    # -- fp32 master -------------------------------------------------------------------------
    def full_param(self, p) -> torch.Tensor | None:
        if not self.optimized(p):
            return None
        return self._assemble(p, self._slot(p)[0].master_value())

    @torch.no_grad()
    def set_full_param(self, p, value: torch.Tensor) -> None:
        """The new master, and the model's own copy of it, so the next forward and the next
        step both start from `value`. DeepSpeed writes only its fp32 copy, and the forward
        before the next step still sees the old weights (tests/test_ds_conformance.py
        recorded it); zerolite's fp32 master is often the compute shard itself, so it makes
        the write visible at once everywhere rather than in some layouts only."""
        if not self.optimized(p):
            return
        flat, slot = self._slot(p)
        master = flat.master_value().clone()
        self._write_piece(p, value, master)
        flat.write_master(master)
        flat.refresh_shard_from_master()
        self.sharded.settle_host_copies()
        if flat.is_full_allocated and not flat.full_is_shard:  # gathered: every rank has value
            slot.flat_view(flat.full).copy_(value.detach().reshape(-1))

    # -- optimizer state ---------------------------------------------------------------------
    def _state(self, p, key: str) -> tuple[dict, torch.Tensor]:
        flat, slot = self._slot(p)
        states = getattr(self.optimizer, "state", {})  # no optimizer: no state
        state = states[flat.master] if flat.master in states else {}
        value = state.get(key)
        if not isinstance(value, torch.Tensor) or value.shape != flat.master.shape:
            have = sorted(k for k, v in state.items()
                          if isinstance(v, torch.Tensor) and v.shape == flat.master.shape)
            why = (f"the optimizer has per-element state {have}" if have else
                   "the optimizer has no state yet (torch optimizers create it at their "
                   "first step)")
            raise OptimizerStateKeyError(f"{key} not found in optimizer state fragment of "
                                         f"parameter {slot.name!r}: {why}")
        return state, value

    def full_state(self, p, key: str) -> torch.Tensor | None:
        if not self.optimized(p):
            return None
        return self._assemble(p, self._state(p, key)[1])

    @torch.no_grad()
    def set_full_state(self, p, value: torch.Tensor, key: str) -> None:
        if not self.optimized(p):
            return
        state, tensor = self._state(p, key)
        self._write_piece(p, value, tensor)
        # Offloaded state hands out copies (offload/chunked_optimizer.py, OffloadedState): store it back.
        self.optimizer.state[self._slot(p)[0].master] = state

    # -- gradients ---------------------------------------------------------------------------
    def _reduced_grads(self) -> None:
        """Make every gradient of this window readable as the averaged fp32 shard
        (`master.grad`): gradients still in full buffers (stage 1, reduce_once_per_step) are
        reduced now, as the step would (the sum is linear: the step adds what comes later)."""
        flats = self.sharded.flats
        if not any(f.grad_buffer is not None or f.reduced_grad is not None
                   or (f.master is not None and f.master.grad is not None) for f in flats):
            raise ValueError(f"{GRADS_UNAVAILABLE} (zerolite: at every ZeRO stage, "
                             "accumulated over the micro-steps of the window so far)")
        self.sharded.reduce_pending_grads()

    def full_grad(self, p) -> torch.Tensor | None:
        if not self.optimized(p):
            return None
        self._reduced_grads()
        return self._assemble(p, self._slot(p)[0].master.grad)

    @torch.no_grad()
    def set_full_grad(self, p, value: torch.Tensor) -> None:
        if not self.optimized(p):
            return
        self._reduced_grads()
        master = self._slot(p)[0].master
        if master.grad is None:  # nothing reached this flat in the window: zeros so far
            master.grad = torch.zeros_like(master)
        self._write_piece(p, value, master.grad)

    # -- DeepSpeed's per-parameter local partition (stage 3 only) -----------------------------
    def _check_local(self, p) -> None:
        if self.sharded.stage != 3:
            raise AssertionError(f"{ZERO3_ONLY} (ZeRO stage is {self.sharded.stage})")

    def _local_of(self, full: torch.Tensor | None) -> torch.Tensor | None:
        if full is None:
            return None
        world, rank = self.sharded.world_size, self.sharded.rank
        n = shard_numel(full.numel(), world)
        padded = torch.zeros(n * world, dtype=full.dtype, device=full.device)
        padded[:full.numel()] = full.reshape(-1)
        return padded[rank * n:(rank + 1) * n].clone()

    def _full_of(self, p, local: torch.Tensor) -> torch.Tensor:
        flat, slot = self._slot(p)
        n = shard_numel(slot.numel, self.sharded.world_size)
        if local.numel() != n:
            raise AssertionError(f"Number of elements do not match: {local.numel()} != {n} "
                                 f"(the local partition of {slot.name!r})")
        out = torch.empty(n * self.sharded.world_size, dtype=torch.float32,
                          device=flat.device)
        all_gather_flat(out, local.detach().reshape(-1).to(out.device, torch.float32))
        return out[:slot.numel]

    def local_param(self, p, key: str | None = None) -> torch.Tensor | None:
        self._check_local(p)
        return self._local_of(self.full_param(p) if key is None else self.full_state(p, key))

    def local_grad(self, p) -> torch.Tensor | None:
        self._check_local(p)
        return self._local_of(self.full_grad(p))

    def set_local_param(self, p, value: torch.Tensor, key: str | None = None) -> None:
        self._check_local(p)
        if not self.optimized(p):
            return
        full = self._full_of(p, value)
        if key is None:
            self.set_full_param(p, full)
        else:
            self.set_full_state(p, full, key)

    def set_local_grad(self, p, value: torch.Tensor) -> None:
        self._check_local(p)
        if self.optimized(p):
            self.set_full_grad(p, self._full_of(p, value))


def fragments_of(p: nn.Parameter) -> TensorFragments | None:
    """The engine's fragment access for a managed parameter, else None."""
    return getattr(p, "zl_fragments", None)
