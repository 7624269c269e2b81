"""Saved-tensor hooks that let autograd keep views of gathered parameters without keeping the
pooled buffer they live in.

[Note: why this is needed for the pool] In forward, autograd saves tensors for backward, and
some of them are views into a unit's gathered buffer (the weight itself, `weight.t()` of a
linear layer). Under stage 3 the unit is released after forward and gathered again before
its backward. With a buffer pool the re-gather may land in a different buffer, and the one
released may already hold another unit's parameters. So while forward runs, these hooks
replace every saved tensor that is a view into an in-use pooled buffer by its geometry
(owner flat, offset, sizes, strides); in backward the view is rebuilt on whatever buffer the
flat holds then (gathering it on demand if it is not gathered). Tensors that do not point
into a pooled buffer (activations, inputs) are saved as usual.

Tensors saved under other saved-tensor hooks pushed inside the forward (activation
checkpointing pushes its own) are handled by those hooks: checkpointing keeps nothing from
the first forward and recomputes in backward while the unit is gathered.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _SavedView:
    flat: object
    offset: int
    size: tuple
    stride: tuple


class SavedViewHooks:
    """`pack`/`unpack` for `torch.autograd.graph.saved_tensors_hooks`."""

    def __init__(self, pool, regather):
        self.pool = pool
        self.regather = regather
        """Called with a flat whose saved view is unpacked while it is not gathered."""
        self.redirected = 0
        """Saved tensors replaced by their geometry (counted, for tests and stats)."""

    def pack(self, t: torch.Tensor):
        flat = self.pool.owner_of(t)
        if flat is None:
            return t
        if t.dtype != flat.full.dtype or t.layout != torch.strided:
            self.pool.reuse_blocked = True  # cannot rebuild it: keep the buffer out of reuse
            return t
        self.redirected += 1
        return _SavedView(flat, t.storage_offset(), tuple(t.size()), tuple(t.stride()))

    def unpack(self, saved):
        if not isinstance(saved, _SavedView):
            return saved
        flat = saved.flat
        if not flat.is_full_allocated:
            self.regather(flat)
        return flat.full.as_strided(saved.size, saved.stride, saved.offset)

    def context(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
