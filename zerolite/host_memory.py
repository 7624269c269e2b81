"""An opt-in glibc allocator setting; zerolite itself never changes the allocator.

[Note: why opt-in only] Pinning glibc's mmap threshold (here to 1 MiB) makes every larger
allocation a fresh mmap that is returned to the OS on free: RSS then follows live bytes
closely, but every activation, gradient and gathered buffer above the threshold is
page-faulted and zero-filled again on each allocation, a large share of the step time
(docs/architecture.md, "Design choices"). An engine must not make that trade silently for its user, so zerolite keeps glibc's defaults and instead reuses its
own full-size buffers (zerolite/zero/buffer_pool.py), which bounds memory without page
faults. Call `fix_mmap_threshold()` yourself before building the model if resident memory
matters more to you than speed; benchmarks apply it to no engine.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger("zerolite")

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_done = False


def fix_mmap_threshold(threshold_bytes: int = 1 << 20) -> bool:
    """Pin glibc's mmap threshold for this process (once). Returns whether it was applied
    (False where glibc is not the C library). Affects every allocation of the process."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):
        return False
    _done = ok
    if ok:
        logger.info("zerolite: glibc mmap threshold pinned at %d bytes (opt-in)", threshold_bytes)
    return ok


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_counters():
    """A function returning glibc's heap counters now (mallinfo2, in bytes), or None where
    glibc is not the C library: in use vs free-but-resident says how much of RSS the
    allocator keeps."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):
        return None
    if fn is None:
        return None
    fn.restype = _MallInfo2
    names = {"arena": "heap", "hblkhd": "mmapped", "uordblks": "heap_in_use",
             "fordblks": "heap_free"}

    def read() -> dict:
        info = fn()
        return {v: getattr(info, k) for k, v in names.items()}
    return read
