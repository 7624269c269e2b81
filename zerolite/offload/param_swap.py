"""`offload_param.device: "nvme"` (ZeRO-Infinity's parameter tier, stage 3): every flat's
compute-dtype shard lives in a file under `nvme_path` and is in RAM only around its gather.

Each such flat's placement is a `FileShard` (zerolite/zero/flat_placement.py, chosen by
plan.py before the flat is built); one `ParamFiles` holds the files, the read-ahead and the
spare buffers of all of them, and hands loaded buffers to the flats (`FlatParam.hold_shard` /
`drop_shard`: only the flat assigns its tensors).

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
then the re-gathers after the step) are recorded (a `RecordedOrder`, zerolite/zero/schedule.py);
while the next step fetches in the same order, each fetch starts reads for the next `buffer_count` upcoming units on an I/O thread, so
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
from zerolite.zero.buffer_pool import SpareBuffers
from zerolite.zero.flat_placement import ShardHome, ShardPlacement
from zerolite.zero.schedule import RecordedOrder

logger = logging.getLogger("zerolite")


class FileShard(ShardPlacement):
    """One flat's compute-dtype shard in `files` (or, `from_master`, in the chunked optimizer's
    master files: fp32 with both offloads, where the shard IS the master)."""

    home = ShardHome.FILE

    def __init__(self, files: "ParamFiles", name: str, from_master):
        self.files, self.name = files, name
        self.from_master = from_master
        """The SwappedMasters the shard is read from, or None (it has a file of its own)."""

    def place(self, flat, shard: torch.Tensor) -> None:
        self.files.adopt(flat, self, shard)
        return None  # out of memory until its first gather

    def read(self, flat) -> torch.Tensor:
        return self.files.read_whole(flat)

    def write(self, flat, lo: int, values: torch.Tensor) -> None:
        self.files.write(flat, lo, values)


class ParamFiles:
    def __init__(self, *, nvme_path: str, rank: int, read_ahead: int):
        self._files = SwapFiles(nvme_path, rank, block="offload_param")
        self._io = ThreadPoolExecutor(1, thread_name_prefix="zerolite-param-io")
        weakref.finalize(self, _close, self._io, self._files)
        self.read_ahead = read_ahead
        self._flats: list = []
        self._spare = SpareBuffers()
        self._pending: dict[int, tuple] = {}
        """id(flat) -> (flat, future of its read, its unit) for read-aheads not yet used."""
        self._order = RecordedOrder()
        """Units in fetch order: the last step's (record) and this step's (current)."""
        self.stats = {"reads": 0, "read_ahead_hits": 0, "wait_s": 0.0, "buffers_reused": 0}

    def placement(self, name: str, from_master=None) -> FileShard:
        return FileShard(self, name, from_master)

    def adopt(self, flat, where: FileShard, shard: torch.Tensor) -> None:
        """At the flat's construction: write its initial shard (unless it is read from the
        master files)."""
        self._flats.append(flat)
        if where.from_master is None:
            self._files.write(where.name, 0, 0, shard.cpu())

    # -- reading ---------------------------------------------------------------------------
    def _buffer(self, flat) -> torch.Tensor | None:
        """A spare read buffer of the flat's shard size (see [Note: spare read buffers])."""
        buf = self._spare.take((flat.shard_numel, flat.compute_dtype))
        if buf is not None:
            self.stats["buffers_reused"] += 1
        return buf

    def _recycle(self, flat, buf: torch.Tensor) -> None:
        """Keep `buf` (no longer referenced by the flat) as a spare, where that is safe."""
        if not flat.full_is_shard and buf.device.type == "cpu":
            self._spare.give((flat.shard_numel, flat.compute_dtype), buf)

    def _read(self, flat, buf=None) -> torch.Tensor:
        where = flat.placement.shard
        if where.from_master is not None:
            return where.from_master.read(flat.master, buf)
        if buf is None:
            buf = torch.empty(flat.shard_numel, dtype=flat.compute_dtype)
        self._files.read(where.name, 0, 0, buf)
        return buf.to(flat.device)  # Note: accelerator copy untested (no GPU here)

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
            if not flat.shard_loaded:
                flat.hold_shard(self._take(flat))
        if self._order.follow(unit):
            self._read_ahead(self._order.upcoming())

    def _read_ahead(self, upcoming: list) -> None:
        queued = set(self._pending)
        issued = {unit for _, _, unit in self._pending.values()}
        for unit in upcoming:
            if len(issued) >= self.read_ahead:
                return
            issued.add(unit)
            for flat in unit.flats:
                if id(flat) not in queued and not flat.shard_loaded:
                    self._pending[id(flat)] = (flat, self._io.submit(self._read, flat,
                                                                   self._buffer(flat)), unit)

    def after_gather(self, unit) -> None:
        self._drop([f for f in unit.flats if not f.full_is_shard])

    def after_release(self, unit) -> None:
        self._drop([f for f in unit.flats if f.full_is_shard])

    def _drop(self, flats) -> None:
        dropped = False
        for flat in flats:
            if flat.shard.numel():
                self._recycle(flat, flat.drop_shard())
                dropped = True
        if dropped and self._order.following:
            # The read-ahead skipped this unit while its buffer was loaded (e.g. its forward
            # gather, with its backward gather next): now its next use can be read ahead.
            self._read_ahead(self._order.upcoming())

    def read_whole(self, flat) -> torch.Tensor:
        """The flat's current shard values (the loaded buffer, or a fresh read)."""
        if flat.shard_loaded:
            return flat.shard
        self._drop_pending(flat)
        return self._read(flat)

    # -- writing -----------------------------------------------------------------------------
    def write(self, flat, lo: int, values: torch.Tensor) -> None:
        values = values.detach().reshape(-1).to(flat.compute_dtype)
        self._drop_pending(flat)  # a read-ahead of the old values must not be used
        where = flat.placement.shard
        if where.from_master is None:  # else the optimizer wrote its master files
            self._files.write(where.name, 0, lo * values.element_size(), values.cpu())
        if flat.shard.numel():
            flat.copy_into_shard(lo, values)

    def _drop_pending(self, flat) -> None:
        item = self._pending.pop(id(flat), None)
        if item is not None:
            self._recycle(flat, item[1].result())

    def new_sequence(self) -> None:
        """After an optimizer step: drop unused read-aheads, keep this step's fetch order."""
        for flat, fut, _ in self._pending.values():
            self._recycle(flat, fut.result())
        self._pending.clear()
        self._order.roll()
        # The first gathers of the next step (re-gathered persistent units, then forward)
        # are read now, behind whatever runs before them (data loading, logging).
        self._read_ahead(self._order.upcoming())

    def read_ahead_flats(self) -> list:
        """Flats whose shard is being read ahead (and not used yet)."""
        return [flat for flat, _, _ in self._pending.values()]

    # -- accounting ---------------------------------------------------------------------------
    def read_buffer_bytes(self) -> int:
        """Host bytes of shard buffers held apart from the flats: spares and read-aheads."""
        pending = sum(f.shard_numel * f.shard.element_size() for f, _, _ in
                      self._pending.values())
        return self._spare.held_bytes() + pending

    def offload_stats(self) -> dict:
        loaded = sum(f.shard.numel() * f.shard.element_size() for f in self._flats)
        pending = sum(f.shard_numel * f.shard.element_size() for f, _, _ in
                      self._pending.values())
        return {**self.stats, "resident_shard_bytes": loaded, "read_ahead_bytes": pending,
                "disk_bytes": self._files.disk_bytes(), "bytes_read": self._files.bytes_read,
                "bytes_written": self._files.bytes_written, "swap_dir": self._files.dir,
                "shards_from_master_files": sum(f.placement.shard.from_master is not None
                                                for f in self._flats)}


def _close(io: ThreadPoolExecutor, files: SwapFiles) -> None:
    io.shutdown(wait=True)
    files.close()
