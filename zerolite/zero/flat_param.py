"""FlatParam: one unit's parameters (of one dtype / requires_grad / param group) laid out in
one padded 1-D buffer, sharded evenly across ranks.

[Note: pooled buffers, saved views redirected] While a unit is gathered its full buffer is
one taken from the model's BufferPool; "releasing" gives it back, so the next unit (or the
next step) reuses the memory instead of the allocator faulting in a fresh one. Views that
autograd saves in forward (e.g. `weight.t()`) are not allowed to pin the buffer: the
saved-tensor hooks of saved_views.py record where they point and rebuild them on the
buffer the flat holds in backward. The user's nn.Parameter objects are kept: their `.data`
is a view into the full buffer while gathered and an empty tensor while sharded (as
DeepSpeed does), so names and object identity never change. With one partition (world 1,
or stage 0) the shard already is the full buffer: gathering only re-points the params.

[Note: hpZ secondary shard] With `secondary_partitions` h > 1 (ZeRO++ hpZ), a flat may also
hold a secondary shard: slice `secondary_rank` of h of its gathered full buffer (1/h of the
padded flat; h divides the partitions, so the slices are equal). It is cut from the full
buffer when the unit is released after its forward (`keep_secondary`), lets the next gather
run over the h ranks of this rank's hpZ group instead of every rank (comm/reducers.py), and
is dropped after the unit's backward. It is never stale: every write of the shard or the
master drops it first, so a gather from it always yields the current parameters. It is
never saved (checkpoints read the shard and the master).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from zerolite.comm.collectives import broadcast
from zerolite.errors import ZeroliteStateError
from zerolite.zero.buffer_pool import BufferPool
from zerolite.zero.flat_placement import ON_DEVICE, FlatPlacement, FlatSpec, MasterHome
from zerolite.zero.sliced_param import copy_full_value, full_shape
from zerolite.zero.shard_math import rank_range, shard_numel


@dataclass(frozen=True)
class ParamSlot:
    """Where one parameter lives inside its FlatParam."""

    names: tuple[str, ...]
    """Every fully-qualified name the model uses for it (tied params have several)."""
    shape: tuple[int, ...]
    offset: int
    numel: int

    @property
    def name(self) -> str:
        return self.names[0]

    def flat_view(self, flat: torch.Tensor) -> torch.Tensor:
        """This parameter's elements of a flat-shaped (full, padded) tensor, 1-D."""
        return flat[self.offset:self.offset + self.numel]

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        """This parameter's elements of a flat-shaped tensor, in the parameter's shape."""
        return self.flat_view(flat).view(self.shape)


class FlatParam:
    """A padded flat buffer of parameters: the local shard always, the full buffer on demand.

    Where the shard and the fp32 master live is its `placement` (flat_placement.py), given
    at construction and never changed; only this class assigns its tensors."""

    def __init__(self, params: list[tuple[tuple[str, ...], nn.Parameter]], *, rank: int,
                 partitions: int, compute_dtype: torch.dtype, group_index: int | None,
                 pool: BufferPool | None = None, placement: FlatPlacement | None = None,
                 master_dtype: torch.dtype = torch.float32,
                 secondary_partitions: int = 1, secondary_rank: int = 0,
                 comm_dtype: torch.dtype | None = None, fetch_dtype: torch.dtype | None = None,
                 grad_accum_dtype: torch.dtype = torch.float32, keeps_reduced_grad: bool = False):
        self.params = [p for _, p in params]
        self.requires_grad = params[0][1].requires_grad
        self.group_index = group_index
        """Index of the optimizer param group; None = not optimized (frozen or not passed)."""
        self.partitions = partitions
        """Ranks the flat is split over: the world size, or 1 at stage 0 (nothing sharded)."""
        self.rank = rank if partitions > 1 else 0
        """This rank's slice index within the partitions."""
        if secondary_partitions > 1 and (partitions % secondary_partitions
                                         or not 0 <= secondary_rank < secondary_partitions):
            raise ZeroliteStateError(f"hpZ secondary partitions {secondary_partitions} (rank "
                                     f"{secondary_rank}) do not fit {partitions} partitions; "
                                     "this is a zerolite bug")
        self.secondary_partitions = secondary_partitions
        """hpZ group size h: a secondary shard is 1/h of the padded flat (1 = no hpZ)."""
        self.secondary_rank = secondary_rank
        """This rank's position in its hpZ group: which 1/h slice its secondary shard is."""
        self.secondary: torch.Tensor | None = None
        """The hpZ secondary shard while held (Note above), else None."""
        self.compute_dtype = compute_dtype
        self.comm_dtype = comm_dtype
        """dtype this flat's gradients are reduced in (torch_autocast: the autocast dtype for
        lower-precision-safe modules' parameters, fp32 for the rest); None = the reducer's
        own (communication_data_type)."""
        self.fetch_dtype = fetch_dtype
        """dtype the forward/backward fetches all-gather the shard in (torch_autocast at
        stage 3: DeepSpeed's fetch gathers the safe modules' weights in the autocast dtype);
        None = the compute dtype. GatheredParameters and checkpoints gather exactly."""
        self.grad_accum_dtype = grad_accum_dtype
        """The precision this flat's gradients are kept at between micro-steps and after
        their reduction ([Note: gradient precision])."""
        self.grad_buffer_dtype = (compute_dtype if grad_accum_dtype == compute_dtype
                                  else torch.float32)
        """dtype of the full gradient buffer: the parameters' own where gradients are kept
        at their precision (DeepSpeed's default; half the bytes of fp32 in 16-bit training),
        else fp32, rounded to `grad_accum_dtype` where it accumulates."""
        self.keeps_reduced_grad = keeps_reduced_grad
        """Stage 0 in 16 bit: the averaged gradient stays in its 16-bit buffer (`reduced_grad`,
        where `p.grad` shows it, as DeepSpeed's p.grad holds it) until the step hands it to the
        master (`hand_reduced_grad`)."""
        self.reduced_grad: torch.Tensor | None = None
        device = params[0][1].device
        slots, offset = [], 0
        for names, p in params:
            shape = full_shape(p)  # a zero.Init parameter's own shape is (0,)
            slots.append(ParamSlot(tuple(names), tuple(shape), offset, shape.numel()))
            offset += shape.numel()
        self.slots: list[ParamSlot] = slots
        self.numel = offset
        self.shard_numel = shard_numel(offset, partitions)
        self.padded_numel = self.shard_numel * partitions
        optimized = group_index is not None and self.requires_grad
        if placement is None:
            placement = ON_DEVICE.placement_for(FlatSpec(0, 0, self.shard_numel, optimized,
                                                         compute_dtype, device, master_dtype))
        if (placement.master_home is MasterHome.NONE) == optimized:
            raise ZeroliteStateError(f"{self!r}: placement {placement} does not match "
                                     f"optimized={optimized}; this is a zerolite bug")
        self.placement = placement
        self.pool = pool if pool is not None else BufferPool()
        self._empty = torch.empty(0, dtype=compute_dtype, device=device)

        # Build the fp32 flat copy from the ORIGINAL values (before any cast to 16 bit),
        # make it identical on every rank, and keep only this rank's slice.
        flat32 = torch.zeros(self.padded_numel, dtype=torch.float32, device=device)
        for slot, p in zip(slots, self.params):
            copy_full_value(p, slot.flat_view(flat32))
        broadcast(flat32, src=0)
        shard32 = self.local_shard_of(flat32).clone()
        del flat32
        master = nn.Parameter(shard32.to(master_dtype)) if optimized else None
        # Master in the compute dtype (fp32 training, bf16 masters with bf16): the master IS
        # the param shard (until a placement moves the master).
        shard = master.data if master is not None and master_dtype == compute_dtype \
            else shard32.to(compute_dtype)
        self.master: nn.Parameter | None = None
        """Master shard the optimizer updates (only for optimized params): fp32, or bf16 with
        bf16.bf16_master_weights_and_grads."""
        self.shard = shard
        if master is not None:
            self.master = placement.master.place(self, master)
        placed = placement.shard.place(self, shard)
        self.shard = self._empty if placed is None else placed
        """This rank's compute-dtype shard; an empty tensor while it is out of memory
        (ShardHome.FILE between gathers)."""
        self.full = self._empty
        """The gathered buffer while gathered (a pooled one, or the shard itself with one
        partition); an empty tensor otherwise."""
        self.grad_buffer: torch.Tensor | None = None
        """Full-size gradient buffer, alive only while this unit's grads are collected."""
        self.grads_ready = 0
        self.free_full()

    @property
    def device(self) -> torch.device:
        return self._empty.device

    # -- full buffer -------------------------------------------------------------------
    @property
    def is_full_allocated(self) -> bool:
        """The full buffer is held (between a gather's start and its release)."""
        return self.full is not self._empty

    @property
    def full_is_shard(self) -> bool:
        """One partition: the full buffer is the shard, gathering copies nothing."""
        return self.partitions == 1 and self.placement.shard.full_is_shard_capable

    def gather_source(self) -> torch.Tensor:
        """The shard as the all-gather reads it, on the device."""
        return self.placement.shard.gather_source(self)

    def alloc_full(self) -> torch.Tensor:
        if not self.is_full_allocated:
            if self.full_is_shard:
                self.full = self.shard
            else:
                self.full = self.pool.take(self.padded_numel, self.compute_dtype,
                                           self.device, owner=self)
        return self.full

    def free_full(self) -> None:
        """Give the full buffer back and point every param at an empty tensor."""
        for p in self.params:
            p.data = self._empty
        if self.is_full_allocated and not self.full_is_shard:
            self.pool.give(self.full)
        self.full = self._empty

    def use_full_views(self) -> None:
        """Make each param's `.data` a view into the (gathered) full buffer."""
        for slot, p in zip(self.slots, self.params):
            p.data = slot.view(self.full)

    # -- the hpZ secondary shard ------------------------------------------------------------
    def keep_secondary(self) -> None:
        """While gathered: keep this rank's 1/h slice of the full buffer (no-op without hpZ,
        or when one is held already: the full buffer was gathered from it)."""
        if self.secondary_partitions <= 1 or self.secondary is not None:
            return
        if not self.is_full_allocated:
            raise ZeroliteStateError(f"{self!r}: keep_secondary while not gathered; this is a "
                                     "zerolite bug")
        n = self.padded_numel // self.secondary_partitions
        lo = self.secondary_rank * n
        self.secondary = self.full[lo:lo + n].clone()

    def drop_secondary(self) -> None:
        self.secondary = None

    @property
    def secondary_nbytes(self) -> int:
        s = self.secondary
        return 0 if s is None else s.numel() * s.element_size()

    # -- the shard's memory (placements out of memory: ShardHome.FILE) -------------------
    @property
    def shard_loaded(self) -> bool:
        return self.shard is not self._empty or self.shard_numel == 0

    def hold_shard(self, buf: torch.Tensor) -> None:
        """Take `buf` (this rank's shard values, read back into memory) as the shard."""
        self.shard = buf
        if self.full_is_shard and self.is_full_allocated:
            self.full = buf

    def drop_shard(self) -> torch.Tensor:
        """Let go of the in-memory shard (its placement keeps the values); returns it."""
        buf, self.shard = self.shard, self._empty
        if self.full_is_shard and self.full is buf:
            self.full = self._empty
        return buf

    def refresh_shard_from_master(self) -> None:
        """After an optimizer step (or a write of the master): the new master values into
        the compute-dtype shard, wherever each lives. Drops the hpZ secondary shard: it holds
        the old values."""
        self.drop_secondary()
        if self.master is not None:
            self.placement.master.refresh_shard(self)

    # -- the compute-dtype shard, wherever it lives --------------------------------------
    def shard_value(self) -> torch.Tensor:
        """This rank's compute-dtype shard: `shard`, or read from its offload file while it
        is out of RAM (offload_param)."""
        return self.placement.shard.read(self)

    def write_shard(self, lo: int, values: torch.Tensor) -> None:
        """Write `values` (cast to the compute dtype) into the shard from element `lo`."""
        self.drop_secondary()
        self.placement.shard.write(self, lo, values)

    def copy_into_shard(self, lo: int, values: torch.Tensor) -> None:
        """Write `values` into the in-memory shard tensor (placements call this)."""
        self.drop_secondary()
        self.shard[lo:lo + values.numel()].copy_(values.reshape(-1))

    # -- the fp32 master, wherever it lives ----------------------------------------------
    def master_value(self) -> torch.Tensor:
        """This rank's fp32 master values: the master itself, or (swapped out to the offload
        files) a temporary copy read from them."""
        return self.placement.master.read(self)

    def write_master(self, value: torch.Tensor) -> None:
        """Overwrite the whole fp32 master shard (and, when swapped out, the compute shard
        the store derives from it)."""
        self.drop_secondary()
        self.placement.master.write(self, value)

    def master_nbytes(self) -> int:
        """RAM the fp32 master takes beyond the compute-dtype shard."""
        return self.placement.master.resident_nbytes(self)

    def take_grad_shard(self, shard: torch.Tensor, name: str) -> None:
        """A reduced gradient shard for the master (added to one already there); stage 0's
        16-bit one is held as `reduced_grad` (keeps_reduced_grad)."""
        if self.keeps_reduced_grad and shard.dtype == self.grad_buffer_dtype:
            if self.reduced_grad is None:
                self.reduced_grad = shard  # the pooled buffer, reduced in place
            else:  # a second backward on the boundary: added as DeepSpeed's p.grad adds it
                self.reduced_grad.add_(shard)
                self.pool.give(shard)
            return
        self.placement.master.take_grad_shard(self, shard, name)

    def hand_reduced_grad(self) -> None:
        """The held 16-bit averaged gradient to the master (fp32); its buffer goes back to
        the pool, so `p.grad` must not view it any more."""
        if self.reduced_grad is not None:
            buf, self.reduced_grad = self.reduced_grad, None
            self.placement.master.take_grad_shard(self, buf, "stage-0 gradient")
            self.pool.give(buf)

    def drop_reduced_grad(self) -> None:
        if self.reduced_grad is not None:
            self.pool.give(self.reduced_grad)
            self.reduced_grad = None

    # -- gradients ---------------------------------------------------------------------
    # [Note: gradient precision] DeepSpeed keeps gradients in data_types.grad_accum_dtype
    # (default: the training dtype, so bf16 under bf16 and fp16 under fp16) and sends them in
    # communication_data_type (default: the training dtype too): stages 0-1 add each
    # micro-step's gradient to the local sum in that dtype and reduce the sum once; stages 2-3
    # reduce every micro-step and add the reduced shard to the accumulated one in that dtype;
    # the optimizer gets the fp32 value of the result. zerolite's full gradient buffer has
    # that dtype when it is the parameters' (else fp32), and the fp32 gradient shards are
    # rounded to it wherever DeepSpeed's would round (an fp32 add then a rounding is what
    # torch's 16-bit add does), so a step gets DeepSpeed's gradient bit for bit;
    # `data_types.grad_accum_dtype: "fp32"` and `communication_data_type: "fp32"` keep every
    # bit of the sums, as they do there.
    def round_grad_(self, grad: torch.Tensor) -> torch.Tensor:
        """Round the fp32 `grad` in place to `grad_accum_dtype` (Note above); a buffer of
        that dtype already is."""
        if grad.dtype == torch.float32 and self.grad_accum_dtype != torch.float32:
            grad.copy_(grad.to(self.grad_accum_dtype))
        return grad

    def take_param_grad(self, index: int, scale: float = 1.0) -> bool:
        """Move param `index`'s grad, times `scale`, into the flat buffer. Returns True when
        all are in."""
        p, slot = self.params[index], self.slots[index]
        fresh = self.grad_buffer is None
        if fresh:
            # Every slot is written exactly once per backward (each param's grad hook fires
            # once), so only the padding needs zeros; untouched slots are zeroed when the
            # flat's grads are complete (`zero_missing_slots`).
            self.grad_buffer = self.pool.take(self.padded_numel, self.grad_buffer_dtype,
                                              self.device)
            self.grad_buffer[self.numel:].zero_()
            self._slot_written = [False] * len(self.slots)
        view = slot.flat_view(self.grad_buffer)
        if p.grad is None:
            if not self._slot_written[index]:
                view.zero_()
        elif self._slot_written[index]:
            # accumulated over micro-steps (stages 0-1)
            self.round_grad_(view.add_(p.grad.reshape(-1), alpha=scale))
        else:
            view.copy_(p.grad.reshape(-1))
            if scale != 1.0:
                self.round_grad_(view.mul_(scale))
        p.grad = None
        self._slot_written[index] = True
        self.grads_ready += 1
        return self.grads_ready == len(self.params)

    def take_grad_buffer(self) -> torch.Tensor:
        """Hand the full gradient buffer over (slots that got no grad read as zeros)."""
        buf = self.grad_buffer
        for slot, written in zip(self.slots, self._slot_written):
            if not written:
                slot.flat_view(buf).zero_()
        self.grad_buffer = None
        self.grads_ready = 0
        return buf

    def local_piece(self, index: int) -> torch.Tensor:
        """The part of param `index` this rank's shard holds, as a 1-D view of the shard (0 to
        numel elements: a param may straddle shards), or an empty tensor while the shard is
        out of memory: what DeepSpeed calls the param's `ds_tensor`."""
        slot = self.slots[index]
        lo, hi = rank_range(self.rank, self.shard_numel)
        start, end = max(slot.offset, lo), min(slot.offset + slot.numel, hi)
        if not self.shard_loaded or start >= end:
            return self.shard.new_empty(0)
        return self.shard[start - lo:end - lo]

    def local_shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full (padded) flat-shaped tensor."""
        lo, hi = rank_range(self.rank, self.shard_numel)
        return flat[lo:hi]

    def __repr__(self):
        comm = "" if self.comm_dtype is None else f", comm={self.comm_dtype}"
        return (f"FlatParam(params={len(self.params)}, numel={self.numel}, "
                f"shard={self.shard_numel}, dtype={self.compute_dtype}{comm}, "
                f"group={self.group_index})")
