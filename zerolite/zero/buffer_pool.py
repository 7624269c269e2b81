"""A pool of full-size flat buffers (gathered parameters, gradient buffers) reused across
units and steps.

[Note: reuse buffers, do not lean on the allocator] ZeRO-3 gathers and frees a unit's full
parameters twice per step and builds a full gradient buffer per unit. Handing those back to
the C allocator and asking again costs page faults and zero-fill (glibc serves large blocks
with mmap) or keeps fragmented heap resident (its dynamic threshold). The pool keeps freed
buffers in free lists keyed by (numel, dtype, device) and hands them out again. A buffer is
created only when its free list is empty, so the pool never holds more buffers of a key than
were in use at once: its size is set by the largest unit and the live budget (prefetch
depth, reuse distance), not by the number of units or steps. FSDP2 and DeepSpeed keep such
buffers alive for the same reason (on CUDA through the caching allocator).

Buffers that hold gathered parameters are registered with their owner while in use, so the
saved-tensor hooks (saved_views.py) can tell that a tensor autograd saves is a view into a
pooled buffer and save where it points instead of the buffer itself: that is what makes it
safe to hand the buffer to another unit right after release.

[Note: a program may keep a released parameter's data] Under DeepSpeed a tensor taken from a
gathered parameter (`p.data`, or `p.data.cpu()`, which is the same tensor on a CPU engine)
stays valid after the parameter is released: the gather's memory lives while referenced.
DeepSpeed-Chat's ZeRO-3 save keeps such tensors for every parameter. So a spare buffer whose
storage something outside the pool still views is never handed out again; it is dropped and
freed when the program lets go of it.
"""
from __future__ import annotations

import torch


def _key(t: torch.Tensor) -> tuple:
    return t.numel(), t.dtype, t.device


def _viewed_elsewhere(buf: torch.Tensor) -> bool:
    """Does a tensor other than `buf` view its storage? (`buf` and the storage object made
    here hold one reference each.)"""
    return torch._C._storage_Use_Count(buf.untyped_storage()._cdata) > 2


class SpareBuffers:
    """The free list: buffers kept for reuse, keyed by what makes them interchangeable. Used
    by BufferPool (full buffers) and by offload_param's shard reads (offload/param_swap.py)."""

    def __init__(self):
        self._free: dict[tuple, list[torch.Tensor]] = {}

    def take(self, key: tuple) -> torch.Tensor | None:
        free = self._free.get(key)
        return free.pop() if free else None

    def give(self, key: tuple, buf: torch.Tensor) -> None:
        self._free.setdefault(key, []).append(buf)

    def held_bytes(self) -> int:
        return sum(b.untyped_storage().nbytes() for free in self._free.values() for b in free)

    def clear(self) -> int:
        """Drop every spare; returns the bytes dropped."""
        dropped = self.held_bytes()
        self._free.clear()
        return dropped


class BufferPool:
    def __init__(self):
        self._free = SpareBuffers()
        self._owners: dict[int, object] = {}
        """storage data_ptr -> owner (a FlatParam) of buffers holding gathered params."""
        self.created = 0
        self.created_bytes = 0
        self.reused = 0
        self.kept_by_program = 0
        """Spare buffers dropped instead of reused because something still viewed them."""
        self.reuse_blocked = False
        """While set, released buffers are dropped instead of kept (a forward ran without
        the saved-tensor hooks, so autograd may hold views into them until backward ends)."""

    def take(self, numel: int, dtype: torch.dtype, device, owner=None) -> torch.Tensor:
        """A 1-D buffer of `numel` elements with undefined contents."""
        key = (numel, dtype, torch.device(device))
        buf = self._free.take(key)
        while buf is not None and _viewed_elsewhere(buf):  # the program kept a view of it
            self.created_bytes -= buf.untyped_storage().nbytes()
            self.kept_by_program += 1
            buf = self._free.take(key)
        if buf is not None:
            self.reused += 1
        else:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self.created += 1
            self.created_bytes += buf.untyped_storage().nbytes()
        if owner is not None:
            self._owners[buf.untyped_storage().data_ptr()] = owner
        return buf

    def give(self, buf: torch.Tensor) -> None:
        """Return a buffer taken from `take`; the caller must hold no view of it any more."""
        ptr = buf.untyped_storage().data_ptr()
        self._owners.pop(ptr, None)
        if self.reuse_blocked:
            self.created_bytes -= buf.untyped_storage().nbytes()
            return
        self._free.give(_key(buf), buf)

    def owner_of(self, t: torch.Tensor):
        """The owner whose in-use pooled buffer `t` is a view of, else None."""
        if not self._owners:
            return None
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # sparse, meta, some subclasses
            return None
        return self._owners.get(ptr)

    def held_bytes(self) -> int:
        """Bytes of the buffers the pool keeps for reuse right now (not those in use)."""
        return self._free.held_bytes()

    def clear(self) -> None:
        """Drop every free buffer (e.g. before a phase that needs the memory)."""
        self.created_bytes -= self._free.clear()
