"""Optimizer-state chunks in plain files under `nvme_path` (ZeRO-Infinity's NVMe tier).

Every (flat, state name) pair has two files, slot 0 and slot 1. A step reads each chunk from
the slot that holds its committed value and writes the updated chunk into the other slot; the
owner flips a chunk's slot only after the whole step has finished (see chunked_optimizer.py).
A run that dies half-way through a step therefore never overwrites a committed value.

Note: plain buffered pread/pwrite (os.preadv / os.pwrite, which release the GIL) instead of
libaio or O_DIRECT: no native dependency and no alignment rules; the page cache holds what the
kernel likes, but none of it counts as this process's resident memory.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import torch

from zerolite.errors import ZeroliteConfigError, ZeroliteStateError


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a writable buffer (any dtype, bf16 included)."""
    return memoryview(t.view(-1).view(torch.uint8).numpy())


class SwapFiles:
    """A private directory of slot files for one rank; counts the bytes it moves."""

    def __init__(self, nvme_path: str, rank: int, block: str = "offload_optimizer"):
        """`block`: the config block this swap directory serves (named in errors)."""
        kind = "offload" if block == "offload_optimizer" else "params"
        try:
            os.makedirs(nvme_path, exist_ok=True)
            self.dir = tempfile.mkdtemp(prefix=f"zerolite-{kind}-rank{rank}-", dir=nvme_path)
        except OSError as e:
            raise ZeroliteConfigError(
                f"zero_optimization.{block}.nvme_path: cannot create a swap "
                f"directory under {nvme_path!r}: {e}") from e
        self._fds: dict[tuple[str, int], int] = {}
        self.bytes_read = 0
        self.bytes_written = 0

    def _fd(self, name: str, slot: int) -> int:
        fd = self._fds.get((name, slot))
        if fd is None:
            path = os.path.join(self.dir, f"{name}.{slot}")
            fd = self._fds[(name, slot)] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def read(self, name: str, slot: int, offset: int, out: torch.Tensor) -> None:
        """Fill `out` (contiguous, CPU) from byte `offset` of file `name`.`slot`."""
        want = out.numel() * out.element_size()
        got = os.preadv(self._fd(name, slot), [_bytes_of(out)], offset)
        if got != want:
            raise ZeroliteStateError(f"offload swap file {self.dir}/{name}.{slot}: short read "
                                     f"at byte {offset} ({got} of {want} bytes); was it "
                                     "truncated or removed while training?")
        self.bytes_read += got

    def write(self, name: str, slot: int, offset: int, src: torch.Tensor) -> None:
        buf, done = _bytes_of(src.contiguous()), 0
        while done < len(buf):  # pwrite may write less than asked
            done += os.pwrite(self._fd(name, slot), buf[done:], offset + done)
        self.bytes_written += done

    def disk_bytes(self) -> int:
        return sum(os.fstat(fd).st_size for fd in self._fds.values())

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
