"""An optimizer whose per-element state (Adam's exp_avg / exp_avg_sq, SGD's momentum, ...) lives
in swap files and is stepped in `sub_group_size`-element chunks.

The update itself is the engine's own optimizer class run on one chunk at a time: every fp32
master shard is cut into chunk views (`master[lo:hi]`, sharing its storage) and an inner
instance of the same class holds those views. For each chunk the state is read from disk (the
next chunk's read runs on an I/O thread meanwhile), put into the inner optimizer's state, the
inner step runs on that chunk only, and the updated state is written back (write-behind on the
same thread). Element-wise optimizers give bit-for-bit the update they give on whole shards.

[Note: commit per step] A chunk's new state goes to the other of its two file slots and the
slot is flipped only when the whole step is done, so files never hold a half-written value.
If a step fails half-way (the masters are then partly updated), the touched shards are marked
torn and reading their state (what a checkpoint does) raises until they are loaded again.

[Note: swapped masters] With 16-bit training (`master_sinks` given) the fp32 masters go to
the files too, as in ZeRO-Infinity: each chunk's master slice is read ahead with its state
into a host buffer, updated there, written back with the state (same two-slot commit) and
cast into the compute-dtype shard by the master's sink. The master nn.Parameter keeps its
identity (optimizer param, key of `state`, holder of the in-memory fp32 `.grad`), but its
`.data` is a one-element NaN tensor expanded to the shard's shape: torch only lets a grad of
the shard's shape sit on a param of that shape, and NaN makes any read that bypasses
`read_master` show up in the numbers instead of passing silently.
"""
from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor, wait
from collections.abc import MutableMapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from zerolite.errors import ZeroliteStateError
from zerolite.optim.builder import accepted_kwargs
from zerolite.optim.master_update import state_entry_dtype
from zerolite.offload.swap_files import SwapFiles


@dataclass(eq=False)
class _Chunk:
    master: nn.Parameter
    key: str
    """File-name stem of the master shard this chunk belongs to."""
    lo: int
    hi: int
    view: torch.Tensor | None
    """The chunk of the in-memory master (None when the master is swapped out)."""
    on_disk: bool
    group: int = 0
    slot: int = 0
    has_state: bool = False
    small: dict = field(default_factory=dict)
    """State entries that are not chunk-shaped (e.g. Adam's step count)."""
    resident: dict | None = None
    """Chunk-shaped state kept in memory (chunks beyond `ratio`)."""
    sink: object = None
    """Swapped master: sink(lo, fp32 values) writes the compute-dtype shard's chunk."""
    mslot: int = 0
    """Swapped master: the file slot holding its committed master values."""
    rmaster: torch.Tensor | None = None
    """Swapped master of a chunk beyond `ratio`: its slice, kept in memory."""

    @property
    def swapped(self) -> bool:
        return self.sink is not None


class ChunkedOffloadOptimizer(torch.optim.Optimizer):
    """Wraps a freshly built optimizer over master shards (fp32 or bf16; its state must be
    empty)."""

    def __init__(self, base: torch.optim.Optimizer, *, nvme_path: str, rank: int,
                 sub_group_size: int, ratio: float = 1.0, pin_memory: bool = False,
                 master_sinks: dict | None = None):
        if len(base.state):
            raise ZeroliteStateError("offload_optimizer: the optimizer already has state; "
                                     "offload must wrap it before the first step")
        super().__init__(base.param_groups, base.defaults)
        dtypes = {m.dtype for g in self.param_groups for m in g["params"]}
        if len(dtypes) > 1:
            raise ZeroliteStateError(f"offload_optimizer: masters of several dtypes {dtypes}")
        self._master_dtype = dtypes.pop() if dtypes else torch.float32
        """fp32, or bf16 with bf16.bf16_master_weights_and_grads (one dtype for all)."""
        self._master_esize = torch.empty(0, dtype=self._master_dtype).element_size()
        self._files = SwapFiles(nvme_path, rank)
        self._pin = pin_memory
        self._chunks: list[_Chunk] = []
        self._by_master: dict[nn.Parameter, list[_Chunk]] = {}
        inner_groups = []
        for group in self.param_groups:
            views = []
            for master in group["params"]:
                key = f"shard{len(self._by_master)}"
                chunks = self._by_master[master] = []
                sink = (master_sinks or {}).get(master)
                for lo in range(0, master.numel(), sub_group_size):
                    hi = min(lo + sub_group_size, master.numel())
                    chunks.append(_Chunk(master, key, lo, hi, master.detach()[lo:hi], True,
                                         group=len(inner_groups), sink=sink))
                self._chunks += chunks
                views += [c.view for c in chunks]
            inner_groups.append({**{k: v for k, v in group.items() if k != "params"},
                                 "params": views})
        # `ratio`: the fraction of chunks whose state goes to disk; the rest stay in memory.
        n_disk = round(ratio * len(self._chunks))
        for c in self._chunks[n_disk:]:
            c.on_disk = False
        cls = type(base)
        self._inner = cls(inner_groups, **accepted_kwargs(cls, base.defaults))
        # Note: each inner step sees only the chunk it updates (see step), so the per-call
        # bookkeeping of the optimizer does not grow with the number of chunks.
        for g in self._inner.param_groups:
            g["params"] = []
        self.state = OffloadedState(self)
        self._names: dict[str, torch.dtype] | None = None
        """Chunk-shaped state entries and their dtypes, learned at the first step."""
        self._torn: set = set()
        self._io = ThreadPoolExecutor(1, thread_name_prefix="zerolite-offload-io")
        self._max_chunk = max((c.hi - c.lo for c in self._chunks), default=0)
        # Two host buffer sets: the chunk being updated + the one being read ahead.
        self._pool: list[dict[str, torch.Tensor]] = [{}, {}]
        weakref.finalize(self, _close, self._io, self._files)
        self._swap_out_masters()

    def _swap_out_masters(self) -> None:
        """Write each swapped master's initial values to slot 0 and release its storage."""
        swapped = [m for m, chunks in self._by_master.items() if chunks and chunks[0].swapped]
        if swapped:
            for p in self._pool:
                p[_MASTER] = _host_buffer(self._max_chunk, self._master_dtype, self._pin)
        esize = self._master_esize
        for master in swapped:
            for c in self._by_master[master]:
                if c.on_disk:
                    self._files.write(f"{c.key}.{_MASTER}", 0, c.lo * esize, c.view.cpu())
                else:
                    c.rmaster = c.view.clone()
                c.view = None
            master.data = _placeholder(master)

    # -- the step --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for outer, inner in zip(self.param_groups, self._inner.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        work = [c for c in self._chunks if c.master.grad is not None]
        self._torn |= {c.master for c in work}
        futures = []

        def submit(fn, *args):
            futures.append(self._io.submit(fn, *args))
            return futures[-1]

        try:
            loads = {0: submit(self._load, work[0], 0)} if work else {}
            writes = []
            for i, c in enumerate(work):
                if i + 1 < len(work):
                    loads[i + 1] = submit(self._load, work[i + 1], (i + 1) % 2)
                state, param = loads.pop(i).result() if i in loads else self._load(c, i % 2)
                if state is not None:
                    self._inner.state[param] = {**c.small, **state}
                param.grad = c.master.grad[c.lo:c.hi]
                group = self._inner.param_groups[c.group]
                group["params"] = [param]
                try:
                    self._inner.step()
                finally:
                    group["params"], param.grad = [], None
                new = self._inner.state.pop(param)
                tensors = {k: v for k, v in new.items()
                           if isinstance(v, torch.Tensor) and v.shape == param.shape}
                c.small = {k: v for k, v in new.items() if k not in tensors}
                self._learn_names(tensors)
                if c.swapped:
                    c.sink(c.lo, param)  # the compute-dtype shard's chunk
                if c.on_disk:
                    writes.append(submit(self._store, c, tensors, 1 - c.slot,
                                         param if c.swapped else None))
                else:
                    c.resident = tensors
            for w in writes:
                w.result()
        except BaseException:
            # Note: no read-ahead or write-behind of a failed step may land after step()
            # returned: a later load_state_dict / state assignment would be overwritten.
            wait(futures)
            raise
        for c in work:
            if c.on_disk:
                c.slot = 1 - c.slot
                c.mslot = 1 - c.mslot if c.swapped else c.mslot
            c.has_state = True
        self._torn -= {c.master for c in work}
        return loss

    def state_entry_dtype(self, master, name: str) -> torch.dtype:
        """dtype of the chunk-shaped state entry `name` of `master` (learned at the first
        step, else what the inner optimizer class will make)."""
        if self._names is not None and name in self._names:
            return self._names[name]
        return state_entry_dtype(self._inner, master, name)

    def _learn_names(self, tensors: dict) -> None:
        if self._names is None:
            self._names = {k: v.dtype for k, v in tensors.items()}
            for p in self._pool:
                p.update({k: _host_buffer(self._max_chunk, dt, self._pin)
                          for k, dt in self._names.items()})

    def _load(self, c: _Chunk, pool_index: int) -> tuple[dict | None, torch.Tensor]:
        """(the chunk's state or None before its first step, the tensor the step updates)."""
        device = c.master.device
        param = c.view
        if c.swapped:
            param = c.rmaster
            if c.on_disk:
                buf = self._pool[pool_index][_MASTER][:c.hi - c.lo]
                self._files.read(f"{c.key}.{_MASTER}", c.mslot, c.lo * self._master_esize, buf)
                param = _to_compute_device({_MASTER: buf}, device)[_MASTER]
        if not c.has_state:
            return None, param
        if not c.on_disk:
            return c.resident, param
        out = {}
        for name in self._names:
            t = self._pool[pool_index][name][:c.hi - c.lo]
            self._files.read(f"{c.key}.{name}", c.slot, c.lo * t.element_size(), t)
            out[name] = t
        return _to_compute_device(out, device), param

    def _store(self, c: _Chunk, tensors: dict, slot: int, master=None) -> None:
        for name, t in tensors.items():
            t = t.cpu() if t.device.type != "cpu" else t
            self._files.write(f"{c.key}.{name}", slot, c.lo * t.element_size(), t)
        if master is not None:
            self._files.write(f"{c.key}.{_MASTER}", 1 - c.mslot, c.lo * self._master_esize,
                              master.cpu())

    # -- swapped-out masters (offload/plan.py FileMaster) --------------------------------------
    def read_master(self, master, out: torch.Tensor | None = None) -> torch.Tensor:
        """The committed values (in the masters' dtype) of a swapped-out master shard (into
        `out`, a host buffer of its size and dtype, else a fresh tensor)."""
        self.refuse_if_torn(master)
        if out is None:
            out = torch.empty(master.shape, dtype=self._master_dtype)
        for c in self._by_master[master]:
            part = out[c.lo:c.hi]
            if c.on_disk:
                self._files.read(f"{c.key}.{_MASTER}", c.mslot, c.lo * self._master_esize, part)
            else:
                part.copy_(c.rmaster)
        return out.to(master.device)

    def write_master(self, master, value: torch.Tensor) -> None:
        """Replace a swapped-out master's values (checkpoint load, GatheredParameters) and
        the compute-dtype shard cast from them."""
        value = value.detach().reshape(-1).to(self._master_dtype)
        chunks = self._by_master[master]
        for c in chunks:
            part = value[c.lo:c.hi]
            if c.on_disk:
                self._files.write(f"{c.key}.{_MASTER}", 1 - c.mslot, c.lo * self._master_esize,
                                  part.cpu())
                c.mslot = 1 - c.mslot
            else:
                c.rmaster.copy_(part)
        chunks[0].sink(0, value)

    def master_resident_nbytes(self) -> int:
        return sum(c.rmaster.numel() * c.rmaster.element_size() for c in self._chunks
                   if c.rmaster is not None)

    # -- whole-shard state, for checkpoints (OffloadedState) --------------------------------
    def _state_head(self, master):
        """(chunks, copies of the non-chunked state entries) of `master`'s state, or None when
        it has none yet; refuses a torn shard."""
        chunks = self._by_master.get(master)
        if not chunks or not chunks[0].has_state:
            return None
        self.refuse_if_torn(master)
        return chunks, {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                        for k, v in chunks[0].small.items()}

    def _gather_state(self, master) -> dict | None:
        head = self._state_head(master)
        if head is None:
            return None
        chunks, out = head
        for name, dtype in (self._names or {}).items():
            full = torch.empty(master.shape, dtype=dtype, device=master.device)
            for c in chunks:
                part = full[c.lo:c.hi]
                if c.on_disk:
                    host = part if part.device.type == "cpu" else torch.empty_like(part, device="cpu")
                    self._files.read(f"{c.key}.{name}", c.slot, c.lo * part.element_size(), host)
                    part.copy_(host)
                else:
                    part.copy_(c.resident[name])
            out[name] = full
        return out

    def refuse_if_torn(self, master) -> None:
        """Reading a shard whose last step failed half-way would hand out mixed values."""
        if master in self._torn:
            raise ZeroliteStateError(
                "offload_optimizer: the last optimizer step failed half-way, so this shard's "
                "master and optimizer state are partly updated; restart from the last "
                "checkpoint")

    def _scatter_state(self, master, state: dict) -> None:
        chunks = self._by_master.get(master)
        if chunks is None:
            raise KeyError(master)
        whole = {k: v for k, v in state.items()
                 if isinstance(v, torch.Tensor) and v.shape == master.shape}
        self._learn_names({k: v[:1] for k, v in whole.items()})
        if set(whole) != set(self._names):
            raise ZeroliteStateError(f"offload_optimizer: state entries {sorted(whole)} do not "
                                     f"match the optimizer's {sorted(self._names)}")
        # Like a step: every chunk is written to its other slot first and the slots flip only
        # then, so a write failing half-way leaves the previous state whole.
        for c in chunks:
            if c.on_disk:
                self._store(c, {k: v[c.lo:c.hi] for k, v in whole.items()}, 1 - c.slot)
        for c in chunks:
            if c.on_disk:
                c.slot = 1 - c.slot
            else:
                c.resident = {k: v[c.lo:c.hi].clone() for k, v in whole.items()}
            c.small = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                       for k, v in state.items() if k not in whole}
            c.has_state = True
        self._torn.discard(master)

    def _drop_state(self, master) -> bool:
        chunks = self._by_master.get(master) or []
        had = bool(chunks) and chunks[0].has_state
        for c in chunks:
            c.has_state, c.small, c.resident = False, {}, None
        self._torn.discard(master)
        return had

    # -- one shard's state chunk by chunk, for checkpoints (zerolite/checkpoint) --------------
    # Reading `self.state[master]` builds the whole shard's state in RAM, the very memory
    # offload saves; checkpoint save.py and load.py use these methods instead, which read and
    # write the state chunk by chunk. They never run during a step.

    def state_entries(self, master) -> dict | None:
        """`self.state[master]` with every chunk-shaped entry replaced by a ShardEntry, in the same
        order; reads no file. None when the shard has no state yet."""
        head = self._state_head(master)
        if head is None:
            return None
        out = head[1]
        for name, dtype in (self._names or {}).items():
            out[name] = ShardEntry(dtype, tuple(master.shape))
        return out


    def read_state_slice(self, master, name: str, lo: int, out: torch.Tensor) -> None:
        """out[:] = elements [lo, lo + out.numel()) of entry `name` of `master`'s state, read from
        the swap files (or the in-memory chunks) straight into `out` (contiguous, CPU, its dtype)."""
        self.refuse_if_torn(master)
        hi = lo + out.numel()
        for c in self._by_master[master]:
            a, b = max(lo, c.lo), min(hi, c.hi)
            if a >= b:
                continue
            dst = out[a - lo:b - lo]
            if c.on_disk:
                self._files.read(f"{c.key}.{name}", c.slot, a * dst.element_size(), dst)
            else:
                dst.copy_(c.resident[name][a - c.lo:b - c.lo])


    def stream_state_in(self, master, values: dict, dtypes: dict[str, torch.dtype],
                            fill) -> None:
        """Replace `master`'s state chunk by chunk: `values` are the entries that are not
        chunk-shaped (e.g. Adam's step), `dtypes` the chunk-shaped ones; `fill(name, lo, out)`
        must fill `out` with that entry's elements [lo, lo + out.numel()). Uses the step's own
        chunk buffers. Like a step, new values go to the other file slot and the slots flip only
        once every chunk is written: a failure half-way leaves the previous state intact."""
        chunks = self._by_master.get(master)
        if chunks is None:
            raise KeyError(master)
        self._learn_names({k: torch.empty(1, dtype=dt) for k, dt in dtypes.items()})
        if set(dtypes) != set(self._names) or any(self._names[k] != dt for k, dt in dtypes.items()):
            raise ZeroliteStateError(f"offload_optimizer: state entries {sorted(dtypes)} do not "
                                     f"match the optimizer's {sorted(self._names)}")
        buffers, resident = self._pool[0], {}
        for c in chunks:
            part = {k: buffers[k][:c.hi - c.lo] for k in dtypes}
            for k, t in part.items():
                fill(k, c.lo, t)
            if c.on_disk:
                self._store(c, part, 1 - c.slot)
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
        self._torn.discard(master)

    # -- accounting --------------------------------------------------------------------------
    def offload_stats(self) -> dict:
        """Bytes this rank holds in memory for optimizer state and moves to/from disk."""
        pool = sum(t.numel() * t.element_size() for p in self._pool for t in p.values()
                   if t is not None)
        resident = sum(t.numel() * t.element_size() for c in self._chunks if c.resident
                       for t in c.resident.values())
        return {"chunks": len(self._chunks),
                "chunks_on_disk": sum(c.on_disk for c in self._chunks),
                "buffer_bytes": pool, "resident_state_bytes": resident,
                "masters_swapped": sum(1 for ch in self._by_master.values()
                                       if ch and ch[0].swapped),
                "resident_master_bytes": self.master_resident_nbytes(),
                "disk_bytes": self._files.disk_bytes(), "bytes_read": self._files.bytes_read,
                "bytes_written": self._files.bytes_written, "swap_dir": self._files.dir}

    def resident_state_nbytes(self) -> int:
        s = self.offload_stats()
        return s["buffer_bytes"] + s["resident_state_bytes"]


_MASTER = "master"
"""File-name / buffer key of a swapped-out master's values."""


def _placeholder(master: torch.Tensor) -> torch.Tensor:
    """What a swapped-out master's `.data` is: right shape, one NaN element of storage."""
    return torch.full((1,), float("nan"), dtype=master.dtype,
                      device=master.device).expand(master.shape)


def _host_buffer(numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    # Note: pinning only matters when the masters are on an accelerator; on a CPU-only build
    # torch refuses pin_memory, so pin_memory is a no-op there.
    if pin and torch.cuda.is_available():
        return torch.empty(numel, dtype=dtype, pin_memory=True)
    return torch.empty(numel, dtype=dtype)


def _to_compute_device(state: dict, device: torch.device) -> dict:
    """Host chunk buffers -> the masters' device. Note: the accelerator branch is written but
    untested (no GPU on the test machine); the copy blocks so the next read may reuse the
    host buffer."""
    if device.type == "cpu":
        return state
    return {k: v.to(device) for k, v in state.items()}


def _close(io: ThreadPoolExecutor, files: SwapFiles) -> None:
    io.shutdown(wait=True)
    files.close()


@dataclass(frozen=True)
class ShardEntry:
    """Placeholder for a chunk-shaped state entry (its values stay in the chunks)."""
    dtype: torch.dtype
    shape: tuple[int, ...]


class OffloadedState(MutableMapping):
    """`optimizer.state` keyed by master shard, as torch and zerolite.checkpoint expect.

    Reading an entry assembles the whole shard's state from its chunks (a temporary copy);
    writing one stores it into the chunks' files. Membership tests read nothing.
    """

    def __init__(self, opt: ChunkedOffloadOptimizer):
        self._opt = opt

    def __getitem__(self, master):
        state = self._opt._gather_state(master)
        if state is None:
            raise KeyError(master)
        return state

    def __setitem__(self, master, state):
        self._opt._scatter_state(master, state)

    def __delitem__(self, master):
        if not self._opt._drop_state(master):
            raise KeyError(master)

    def pop(self, master, *default):
        # Note: a torn shard can still be dropped (checkpoint load does that); only reading it fails.
        if master not in self:
            if default:
                return default[0]
            raise KeyError(master)
        value = None if master in self._opt._torn else self[master]
        del self[master]
        return value

    def __contains__(self, master):
        chunks = self._opt._by_master.get(master)
        return bool(chunks) and chunks[0].has_state

    def __iter__(self):
        return iter([m for m in self._opt._by_master if m in self])

    def __len__(self):
        return sum(1 for m in self._opt._by_master if m in self)
