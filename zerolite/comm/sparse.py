"""Top-k sparsified gradient reduction with error feedback (stages 2-3).

The third way to cut gradient traffic, after 16-bit values (`communication_data_type`) and
quantization (qgZ, comm/quantized.py): send only the large entries.

Per FlatParam and reduce, each rank
  1. forms `acc = grad / predivide + residual` (fp32, in the residual's own buffer),
  2. selects its top-k entries by magnitude, `k = ceil(ratio x padded numel)`
     (`triton_kernels.topk_select`: the Triton kernel on CUDA, the torch.topk twin on CPU;
     ties at the threshold are all taken, zeros never), in index order,
  3. keeps the rest as the new residual (`acc` with the sent entries zeroed; without error
     feedback the rest is dropped),
  4. splits the entries by destination shard (they are sorted, so a searchsorted on the shard
     boundaries), exchanges the per-destination counts (one small all_to_all of int64), then
     sends every destination its entries as (index relative to the shard, fp32 value) pairs
     packed in one int32 buffer, in one `all_to_all_single` with split sizes (launched when
     the counts are in, on a second process group: see SparseGradReducer.payload_group),
  5. the owner adds each source rank's entries into a zero fp32 shard, in rank order
     (`index_add_`; a rank's indices are distinct, so the result does not depend on how the
     add is scheduled), and multiplies by `predivide / world` as the dense path does.

[Note: why counts + one all_to_all] The alternatives on gloo: an all-gather of every rank's
whole selection moves (N-1) x k entries to each rank instead of ~k (N-1)/N, and padding each
destination's part to a fixed size wastes what top-k saves when entries cluster in a few
shards (embeddings, the last layer). The counts exchange costs 8 x (N-1) bytes and one
latency; it also sizes the receive buffer exactly.

Wire bytes (what `bytes_sent["all_to_all"]` counts, measured from the tensors handed to the
collectives): 8 bytes per entry sent to another rank + 8 x (N-1) bytes of counts; dense fp32 is
4 bytes per element x (N-1)/N. At ratio r that is about 2r of dense (r=1%: ~2%).

Memory: with error feedback, a full padded fp32 residual per FlatParam on every rank (4 bytes
x parameters): ZeRO-2/3's gradient sharding saving is given back, as for qgZ's error
feedback. Gradient accumulation: every micro-step's reduce is sparsified and the residual
carries across micro-steps and steps; the reduced shards add up in `master.grad` as dense.
A non-finite gradient (fp16 overflow: the step is skipped) ranks above every finite value, so
it is sent and the owner's overflow check fires; the residual is then reset to zero.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from triton_kernels import topk_select
from triton_kernels.topk_ref import selected_count
from zerolite.comm.reducers import GradReducer, PendingReduce

__all__ = ["SparseGradReducer", "pack_entries"]


def pack_entries(idx: torch.Tensor, vals: torch.Tensor, parts: int, shard_numel: int):
    """Sorted global indices + values -> (int32 [m, 2] of (index in its shard, value bits),
    int64 [parts] count per destination shard)."""
    bounds = torch.arange(1, parts + 1, device=idx.device, dtype=torch.int64) * shard_numel
    ends = torch.searchsorted(idx.to(torch.int64), bounds)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    packed = torch.stack([torch.remainder(idx, shard_numel).to(torch.int32),
                          vals.to(torch.float32).view(torch.int32)], dim=1)
    return packed, counts


class _TwoPhase:
    """The counts exchange, then the payload: `is_completed()` (polled at every hook, oldest
    reduce first) launches the payload as soon as the counts have arrived, so both overlap
    backward; `wait()` does the rest."""

    def __init__(self, counts_work, launch):
        self._counts, self._launch, self._payload = counts_work, launch, None

    def _started(self) -> bool:
        if self._payload is None:
            if not self._counts.is_completed():
                return False
            self._counts.wait()  # surfaces an error the exchange ended with
            self._payload = self._launch()
        return True

    def is_completed(self) -> bool:
        return self._started() and self._payload.is_completed()

    def wait(self, timeout=None):
        if self._payload is None:
            self._counts.wait()
            self._payload = self._launch()
        self._payload.wait()
        return True


class SparseGradReducer(GradReducer):
    """Top-k sparsified reduce-scatter of fp32 gradients with error feedback (module doc).

    `ratio`: fraction of a FlatParam's (padded) elements each rank sends per reduce.
    `warmup_reduces`: the first reduces of each FlatParam run the exact dense path (the
    engine passes `warmup_steps x reduces per step`). `predivide` as in GradReducer.
    Stage 0 (`partitions == 1`) is never sparsified (the config refuses stages 0-1).
    """

    def __init__(self, world_size: int, ratio: float = 0.01, error_feedback: bool = True,
                 warmup_reduces: int = 0, predivide: float = 1.0, group=None, wire=None):
        super().__init__(world_size, predivide=predivide, wire=wire)
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio, self.error_feedback = float(ratio), bool(error_feedback)
        self.warmup_reduces = int(warmup_reduces)
        self.group = group
        self.payload_group = None
        """[Note: a second group for the payloads] The counts of a reduce are exchanged when
        it starts (in backward order); its payload is launched once those counts are in,
        when the reduction queue polls it (oldest first) or waits for it. Both orders are the
        same on every rank, but they interleave differently, and a process group needs its
        collectives issued in one order everywhere: so the payloads get their own group.
        Collective: every rank builds its reducer at the same point (engine construction)."""
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            ranks = None if group is None else dist.get_process_group_ranks(group)
            self.payload_group = dist.new_group(ranks=ranks or list(range(dist.get_world_size())))
        self._residuals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._reduces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.entries_sent = 0
        """Entries (index, value) this rank selected, over all reduces (to itself included)."""

    def residual(self, flat) -> torch.Tensor | None:
        """The stored error-feedback residual of `flat` (full padded fp32), if any."""
        return self._residuals.get(flat)

    def start(self, flat, full_grad: torch.Tensor) -> PendingReduce:
        done = self._reduces.get(flat, 0)
        self._reduces[flat] = done + 1
        if flat.partitions == 1 or done < self.warmup_reduces:
            return super().start(flat, full_grad)
        parts, n = flat.partitions, flat.shard_numel
        grad = full_grad.reshape(-1)
        if grad.dtype != torch.float32:
            grad = grad.float()
        if self.predivide != 1.0:
            grad = grad.div_(self.predivide)
        with record_function("zerolite::topk_select"):
            if self.error_feedback:
                res = self._residuals.get(flat)
                if res is None:
                    res = self._residuals[flat] = torch.zeros_like(grad)
                acc = res.add_(grad)  # the residual's buffer now holds grad + residual
            else:
                acc = grad  # the gradient buffer is the caller's scratch (pooled)
            k = selected_count(acc.numel(), self.ratio)
            idx, vals, _ = topk_select(acc, k, residual=acc)
            packed, counts = pack_entries(idx, vals, parts, n)
        if self.error_feedback and vals.numel() and not bool(torch.isfinite(vals).all()):
            res.zero_()  # an overflowed step is skipped; never carry inf/nan forward
        self.entries_sent += int(vals.numel())
        recv_counts = torch.empty_like(counts)
        with record_function("zerolite::all_to_all_sparse_counts"):
            counts_work = dist.all_to_all_single(recv_counts, counts, group=self.group,
                                                 async_op=True)
        box = {}
        # [Note: CUDA streams] `start` runs on the reduce stream (comm/streamed.py) but the
        # payload may be launched from a hook on the compute stream: that stream waits for
        # the selection first. Not yet run on a GPU.
        ready = None
        if packed.is_cuda:
            ready = torch.cuda.Event()
            ready.record()

        def launch():
            if ready is not None:
                torch.cuda.current_stream(packed.device).wait_event(ready)
            send_splits = (counts * 2).tolist()
            recv_splits = (recv_counts * 2).tolist()
            box["recv"] = torch.empty(sum(recv_splits), dtype=torch.int32, device=packed.device)
            box["sources"] = recv_counts.tolist()
            with record_function("zerolite::all_to_all_sparse"):
                return dist.all_to_all_single(box["recv"], packed.reshape(-1), recv_splits,
                                              send_splits, group=self.payload_group,
                                              async_op=True)

        # Per destination: its entries (8 bytes each) and its count; this rank's own stay.
        self.wire.add_to_ranks("all_to_all", flat.rank, {q: 8 * c + counts.element_size()
                                                         for q, c in enumerate(counts.tolist())})
        post = self.predivide / self.world_size

        def finish(_):
            recv, sources = box["recv"], box["sources"]
            shard = torch.zeros(n, dtype=torch.float32, device=recv.device)
            entries = recv.view(-1, 2)
            start = 0
            for count in sources:  # rank order: deterministic sums
                part = entries[start:start + count]
                shard.index_add_(0, part[:, 0].to(torch.int64), part[:, 1].view(torch.float32))
                start += count
            return shard.mul_(post) if post != 1.0 else shard

        return PendingReduce(_TwoPhase(counts_work, launch), None, finish)
