"""`offload_param.device: "nvme"` (ZeRO-Infinity's parameter tier, stage 3): every flat's
compute-dtype shard lives in a file under `nvme_path` and is in RAM only around its gather.

Lifecycle of one flat's shard (`flat.shard` is an empty tensor while it is out):
  fetch       Unit.gather, right before the all-gather: the shard is taken from a finished
              read-ahead, or read now (counted as `wait_s`);
  after_gather  the all-gather is done: the buffer is dropped (world > 1). At world 1 the shard
              is the full buffer, so it is dropped when the unit is released (after_release);
  write       the optimizer step (or a checkpoint load, or a GatheredParameters write-back)
              writes new values into the file (and into the buffer, if one is loaded).

[Note: spare read buffers] At world > 1 a shard buffer is dropped right after its all-gather
and the next read of that size fills it again instead of a fresh allocation: shards are a few
MiB to tens of MiB, which glibc (once its dynamic mmap threshold has risen past them) serves
from the heap, and freed heap blocks between live ones stay resident. Measured on a 63M GPT,
fp32, both offloads, world 2: peak RSS 1446 / 1423 MiB vs 1537 / 1485 MiB with fresh buffers.
A buffer is created only when no spare of its size is left, so there are never more of a
size than were live at once before. At world 1 the shard is the full buffer, which autograd
may hold views of: it is never reused.

Read-ahead: the units fetched in one optimizer step (forward and backward of every micro-step,
then the re-gathers after the step) are recorded; while the next step fetches in the same
order, each fetch starts reads for the next `buffer_count` upcoming units on an I/O thread, so
the disk read hides behind compute. A fetch out of the recorded order (dynamic control flow,
an eval pass) turns read-ahead off until the sequence ends: slower, never wrong.

[Note: fp32 with both offloads] With fp32 training the shard IS the fp32 master. The chunked
optimizer then keeps it in its own master files (two-slot commit), and this class reads the
committed master from there instead of keeping a second copy: the master lives only on disk.
"""
from __future__ import annotations

import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from zerolite.offload.swap_files import SwapFiles

logger = logging.getLogger("zerolite")


class ParamSwap:
    def __init__(self, units, *, nvme_path: str, rank: int, read_ahead: int,
                 master_reader=None):
        """`master_reader(master) -> fp32 tensor` (the chunked optimizer's read_master):
        flats whose shard is their master and whose master is swapped out read from it."""
        self._files = SwapFiles(nvme_path, rank, block="offload_param")
        self._io = ThreadPoolExecutor(1, thread_name_prefix="zerolite-param-io")
        weakref.finalize(self, _close, self._io, self._files)
        self.read_ahead = read_ahead
        self._units = units
        self._name: dict[int, str] = {}
        self._from_master: set[int] = set()
        self._reader = master_reader
        self._spare: dict[tuple, list] = {}
        self._pending: dict[int, tuple] = {}
        """id(flat) -> (flat, future of its read) for read-aheads not yet used."""
        self._unit_of = {id(f): u.index for u in units for f in u.flats}
        self._record: list[int] = []
        self._seq: list[int] = []
        self._following = False
        self.stats = {"reads": 0, "read_ahead_hits": 0, "wait_s": 0.0, "buffers_reused": 0}
        for unit in units:
            for pos, flat in enumerate(unit.flats):
                if master_reader is not None and flat.master is not None \
                        and flat.master_store is not None and flat.compute_dtype == torch.float32:
                    self._from_master.add(id(flat))
                else:
                    self._name[id(flat)] = f"unit{unit.index}.flat{pos}"
                    self._files.write(self._name[id(flat)], 0, 0, flat.shard.cpu())
                flat.shard_store = self
                gathered_at_world1 = flat.full_is_shard and flat.is_full_allocated
                if not gathered_at_world1:  # else it is the live full buffer until release
                    flat.shard = flat._empty
                    if flat.full_is_shard:
                        flat.full = flat._empty
            unit.swap = self

    # -- reading ---------------------------------------------------------------------------
    def _buffer(self, flat) -> torch.Tensor | None:
        """A spare read buffer of the flat's shard size (see [Note: spare read buffers])."""
        free = self._spare.get((flat.shard_numel, flat.compute_dtype))
        if not free:
            return None
        self.stats["buffers_reused"] += 1
        return free.pop()

    def _recycle(self, flat, buf: torch.Tensor) -> None:
        """Keep `buf` (no longer referenced by the flat) as a spare, where that is safe."""
        if not flat.full_is_shard and buf.device.type == "cpu":
            self._spare.setdefault((flat.shard_numel, flat.compute_dtype), []).append(buf)

    def _read(self, flat, buf=None) -> torch.Tensor:
        if id(flat) in self._from_master:
            return self._reader(flat.master, buf)
        if buf is None:
            buf = torch.empty(flat.shard_numel, dtype=flat.compute_dtype)
        self._files.read(self._name[id(flat)], 0, 0, buf)
        return buf.to(flat._empty.device)  # Note: accelerator copy untested (no GPU here)

    def _take(self, flat) -> torch.Tensor:
        item = self._pending.pop(id(flat), None)
        if item is not None:
            self.stats["read_ahead_hits"] += 1
        start = time.perf_counter()
        buf = item[1].result() if item is not None else self._read(flat, self._buffer(flat))
        self.stats["wait_s"] += time.perf_counter() - start
        self.stats["reads"] += 1
        return buf

    def fetch(self, unit) -> None:
        """Put every flat's shard of `unit` in RAM (before its all-gather)."""
        for flat in unit.flats:
            if flat.shard.numel() == 0 and flat.shard_numel > 0:
                flat.shard = self._take(flat)
                if flat.full_is_shard:
                    flat.full = flat.shard
        k = len(self._seq)
        self._seq.append(unit.index)
        self._following = self._following and k < len(self._record) \
            and self._record[k] == unit.index
        if self._following:
            self._read_ahead(self._record[k + 1:])

    def _read_ahead(self, upcoming: list[int]) -> None:
        queued = set(self._pending)
        issued = {self._unit_of[i] for i in queued}
        for index in upcoming:
            if len(issued) >= self.read_ahead:
                return
            issued.add(index)
            for flat in self._units[index].flats:
                if id(flat) not in queued and flat.shard.numel() == 0 and flat.shard_numel:
                    self._pending[id(flat)] = (flat, self._io.submit(self._read, flat,
                                                                   self._buffer(flat)))

    def after_gather(self, unit) -> None:
        self._drop(unit, [f for f in unit.flats if not f.full_is_shard])

    def after_release(self, unit) -> None:
        self._drop(unit, [f for f in unit.flats if f.full_is_shard])

    def _drop(self, unit, flats) -> None:
        dropped = False
        for flat in flats:
            if flat.shard.numel():
                self._recycle(flat, flat.shard)
                flat.shard = flat._empty
                if flat.full_is_shard:
                    flat.full = flat._empty
                dropped = True
        if dropped and self._following:
            # The read-ahead skipped this unit while its buffer was loaded (e.g. its forward
            # gather, with its backward gather next): now its next use can be read ahead.
            self._read_ahead(self._record[len(self._seq):])

    def read_whole(self, flat) -> torch.Tensor:
        """The flat's current shard values (the loaded buffer, or a fresh read)."""
        if flat.shard.numel() or not flat.shard_numel:
            return flat.shard
        self._drop_pending(flat)
        return self._read(flat)

    # -- writing -----------------------------------------------------------------------------
    def write(self, flat, lo: int, values: torch.Tensor) -> None:
        values = values.detach().reshape(-1).to(flat.compute_dtype)
        self._drop_pending(flat)  # a read-ahead of the old values must not be used
        if id(flat) not in self._from_master:  # else the optimizer wrote its master files
            self._files.write(self._name[id(flat)], 0, lo * values.element_size(), values.cpu())
        if flat.shard.numel():
            flat.shard[lo:lo + values.numel()].copy_(values)

    def _drop_pending(self, flat) -> None:
        item = self._pending.pop(id(flat), None)
        if item is not None:
            self._recycle(flat, item[1].result())

    def new_sequence(self) -> None:
        """After an optimizer step: drop unused read-aheads, keep this step's fetch order."""
        for flat, fut in self._pending.values():
            self._recycle(flat, fut.result())
        self._pending.clear()
        if self._seq:
            self._record, self._seq = self._seq, []
        # The first gathers of the next step (re-gathered persistent units, then forward)
        # are read now, behind whatever runs before them (data loading, logging).
        self._following = bool(self._record)
        self._read_ahead(self._record)

    # -- accounting ---------------------------------------------------------------------------
    def read_buffer_bytes(self) -> int:
        """Host bytes of shard buffers held apart from the flats: spares and read-aheads."""
        spare = sum(b.numel() * b.element_size() for free in self._spare.values() for b in free)
        pending = sum(f.shard_numel * f.shard.element_size() for f, _ in self._pending.values())
        return spare + pending

    def offload_stats(self) -> dict:
        loaded = sum(f.shard.numel() * f.shard.element_size() for u in self._units
                     for f in u.flats)
        pending = sum(f.shard_numel * f.shard.element_size() for f, _ in self._pending.values())
        return {**self.stats, "resident_shard_bytes": loaded, "read_ahead_bytes": pending,
                "disk_bytes": self._files.disk_bytes(), "bytes_read": self._files.bytes_read,
                "bytes_written": self._files.bytes_written, "swap_dir": self._files.dir,
                "shards_from_master_files": len(self._from_master)}


def _close(io: ThreadPoolExecutor, files: SwapFiles) -> None:
    io.shutdown(wait=True)
    files.close()
