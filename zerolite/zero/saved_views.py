"""Saved-tensor hooks that let autograd keep views of gathered parameters without keeping the
pooled buffer they live in.

[Note: why this is needed for the pool] In forward, autograd saves tensors for backward, and
some of them are views into a unit's gathered buffer (the weight itself, `weight.t()` of a
linear layer). Under stage 3 the unit is released after forward and gathered again before
its backward. With a buffer pool the re-gather may land in a different buffer, and the one
released may already hold another unit's parameters. So while a unit's forward runs, these
hooks replace every saved tensor that is a view into an in-use pooled buffer by its geometry
(owner flat, offset, sizes, strides); in backward the view is rebuilt on whatever buffer the
flat holds then (gathering it on demand if it is not gathered). Tensors that do not point
into a pooled buffer (activations, inputs) are saved as usual.

[Note: the hooks cover unit forwards, not the root level] They are pushed when a non-root
unit's forward begins inside an engine forward and popped when it ends. Code at the root
level (the embedding, the head, the loss a trainer computes inside the model's forward)
saves tensors the plain autograd way: the root unit stays gathered from its forward until
backward ends, so nothing it saves can go stale, and a custom autograd Function that saves a
parameter gets the Parameter object itself back in backward (with any saved-tensor hook
active, autograd hands back a fresh tensor instead): TRL's chunked loss reads `ds_status` on
it and gathers it if needed, as under DeepSpeed. A unit that GatheredParameters releases
while root-level code may hold views of it blocks buffer reuse until backward ends
(`unprotected`, used by ShardedModel.release_gathered).

Tensors saved under other saved-tensor hooks pushed inside the forward (activation
checkpointing pushes its own) are handled by those hooks: a unit whose forward starts under
hooks that were not there when the engine forward began does not push these (checkpointing
keeps nothing from the first forward and recomputes in backward while the unit is gathered).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.autograd.graph import saved_tensors_hooks

_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
"""(pack, unpack) on top of this thread's saved-tensor hook stack, or None (torch >= 2.1)."""


@dataclass(frozen=True)
class _SavedView:
    flat: object
    offset: int
    size: tuple
    stride: tuple


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a[0] is b[0] and a[1] is b[1]


class SavedViewHooks:
    """`pack`/`unpack` for `torch.autograd.graph.saved_tensors_hooks`, pushed per unit forward."""

    def __init__(self, pool, regather):
        self.pool = pool
        self.regather = regather
        """Called with a flat whose saved view is unpacked while it is not gathered."""
        self.redirected = 0
        """Saved tensors replaced by their geometry (counted, for tests and stats)."""
        self._pack, self._unpack = self.pack, self.unpack  # bound once: compared by identity
        self._in_forward = False
        self._outer = None
        """The hooks on top when the engine forward began (the user's own, or None)."""
        self._scopes: list = []
        """One entry per unit forward in progress: its pushed context, or None."""

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

    # -- scope -------------------------------------------------------------------------
    @contextmanager
    def forward(self):
        """An engine forward: the unit forwards inside it save through these hooks."""
        if _top_hooks is None:  # no way to see the stack: cover the whole forward instead
            with saved_tensors_hooks(self._pack, self._unpack):
                yield
            return
        self._in_forward, self._outer, self._scopes = True, _top_hooks(False), []
        try:
            yield
        finally:  # a forward that raised leaves its unit scopes open: close them here
            for ctx in reversed(self._scopes):
                if ctx is not None:
                    ctx.__exit__(None, None, None)
            self._in_forward, self._outer, self._scopes = False, None, []

    def enter_unit(self) -> None:
        ctx = None
        if self._in_forward and _same(_top_hooks(False), self._outer):
            ctx = saved_tensors_hooks(self._pack, self._unpack)
            ctx.__enter__()
        self._scopes.append(ctx)

    def leave_unit(self) -> None:
        if self._scopes:
            ctx = self._scopes.pop()
            if ctx is not None:
                ctx.__exit__(None, None, None)

    def unprotected(self) -> bool:
        """Inside an engine forward, at a point where saved tensors bypass these hooks."""
        if not self._in_forward or _top_hooks is None:
            return False
        top = _top_hooks(False)
        return top is None or top[0] is not self._pack
