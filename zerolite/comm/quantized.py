"""ZeRO++-style compressed communication: quantized gradient reduce-scatter (qgZ) and
quantized parameter all-gather (qwZ), built on the block quantization kernels in
`triton_kernels` (Triton on CUDA, the bit-exact torch twin on CPU).

qgZ (`QuantizedGradReducer`)
    The full fp32 gradient buffer (`padded_numel = partitions * shard_numel`) is viewed as
    `partitions` chunks; chunk r is what rank r owns. Each chunk is zero-padded to whole
    quantization blocks and quantized (int8 or int4, one fp32 scale per block), the codes and
    the scales are exchanged with two `all_to_all_single`s, and each rank dequantizes the
    `partitions` chunks it received and sums them in fp32 (`dequantize_sum`), then divides by
    the world size. One quantization hop, as in ZeRO++'s all-to-all reduce-scatter.

    Error bound (round to nearest): each rank's chunk contributes at most
    `scale/2 = absmax_block/(2*qmax)` error per element (qmax 127 for int8, 7 for int4), so
    the averaged shard is within `mean over ranks of absmax_block_k/(2*qmax)` of the exact
    average (plus a few fp32 ulps). Stochastic rounding: `< scale` per contribution, and
    unbiased.

qwZ (`QuantizedParamGatherer`)
    This rank's compute-dtype shard is quantized to int8 blocks, codes and scales are
    all-gathered, and on `wait()` every chunk (this rank's too, so all ranks hold identical
    weights) is dequantized into the compute-dtype full buffer. The fp32 masters and the
    16-bit shards stay exact; only the communicated copy is quantized.

Wire bytes per element (block size B, fp32 scales): `bits/8 + 4/B`; for B=256 that is
0.2539x (int8) and 0.1289x (int4) of fp32, plus per-chunk block padding.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.profiler import record_function

from triton_kernels import dequantize, dequantize_sum, quantize
from triton_kernels.quantize_ref import check_args, num_blocks
from zerolite.comm.collectives import all_gather_flat
from zerolite.comm.reducers import GradReducer, ParamGatherer, PendingReduce

__all__ = ["QuantizedGradReducer", "QuantizedParamGatherer", "quantize_chunks"]


class _Works:
    """Several async works seen as one: `wait()` waits for all, `is_completed()` says
    whether all have finished (so step statistics can time it like a plain collective)."""

    def __init__(self, *works):
        self._works = [w for w in works if w is not None]

    def wait(self, timeout=None):
        for w in self._works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works if hasattr(w, "is_completed"))


def quantize_chunks(chunks: torch.Tensor, bits: int, block_size: int, stochastic: bool = False,
                    seed: int = 0):
    """Quantize each row of a 2-D tensor `[K, n]` in its own blocks.

    Rows are zero-padded to `nblocks * block_size` so blocks never straddle two rows (zero
    padding changes neither a block's absmax nor its finiteness). Returns
    `(codes [K, nblocks*block_size*bits/8], scales [K, nblocks])`, one kernel call in all.
    """
    k, n = chunks.shape
    nb = num_blocks(n, block_size)
    pad = nb * block_size - n
    if pad:
        chunks = F.pad(chunks, (0, pad))
    codes, scales = quantize(chunks.reshape(-1), bits, block_size, stochastic=stochastic,
                             seed=seed)
    return codes.view(k, -1), scales.view(k, nb)


def _dequantize_chunks(codes: torch.Tensor, scales: torch.Tensor, bits: int, block_size: int,
                       n: int, out_dtype=torch.float32) -> torch.Tensor:
    """Inverse of `quantize_chunks`: -> `[K, n]` in `out_dtype` (row padding dropped)."""
    k, nb = scales.shape
    flat = dequantize(codes.reshape(-1), scales.reshape(-1), bits, block_size,
                      k * nb * block_size, out_dtype)
    return flat.view(k, nb * block_size)[:, :n]


class QuantizedGradReducer(GradReducer):
    """qgZ: block-quantized all-to-all reduce-scatter of fp32 gradients.

    Stage 0 (`flat.partitions == 1`, an all-reduce) falls back to the exact parent path.

    `error_feedback=True` keeps, per FlatParam, an fp32 residual `g - dequant(quant(g))` of
    everything this rank sent and adds it to the next gradient before quantizing, so the
    quantization error does not accumulate over steps. Memory cost: 4 bytes x the full
    (padded) flat numel per rank, i.e. one unsharded fp32 gradient copy of every trainable
    parameter on every rank -- it gives back the gradient-memory saving of ZeRO-2/3, so use
    it where bandwidth, not memory, is the limit (e.g. with int4). A residual block that is
    non-finite is reset to zero, and a gradient with any non-finite value (fp16 overflow: the
    step is skipped) resets the whole residual, so one overflow never poisons later steps.
    Note: with fp16 dynamic loss scaling the residual is in the loss-scaled units of the step
    it came from; after a scale change it is off by that factor for one step (harmless, the
    residual is a correction of quantization size).

    Stochastic rounding draws a fresh seed per call (rank, call counter), so rounding errors
    are independent across ranks and steps.
    """

    def __init__(self, world_size: int, bits: int = 8, block_size: int = 256,
                 stochastic: bool = False, error_feedback: bool = False, seed: int = 0,
                 wire=None):
        super().__init__(world_size, wire=wire)
        check_args(bits, block_size)
        self.bits, self.block_size = bits, block_size
        self.stochastic, self.error_feedback, self.seed = stochastic, error_feedback, seed
        self._calls = 0
        self._residuals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def residual(self, flat) -> torch.Tensor | None:
        """The stored error-feedback residual of `flat` (full padded fp32), if any."""
        return self._residuals.get(flat)

    def _seed(self, flat) -> int:
        self._calls += 1
        return (self.seed * 1_000_003 + self._calls * 4099 + flat.rank) & 0x7FFFFFFF

    def start(self, flat, full_grad: torch.Tensor) -> PendingReduce:
        if flat.partitions == 1:
            return super().start(flat, full_grad)
        parts, n = flat.partitions, flat.shard_numel
        grad = full_grad.reshape(-1)
        if grad.dtype != torch.float32:
            grad = grad.float()
        if self.error_feedback:
            res = self._residuals.get(flat)
            if res is not None:
                grad = grad + res  # the caller's buffer is left alone
        chunks = grad.view(parts, n)
        seed = self._seed(flat) if self.stochastic else 0
        codes, scales = quantize_chunks(chunks, self.bits, self.block_size, self.stochastic, seed)
        recv_codes, recv_scales = torch.empty_like(codes), torch.empty_like(scales)
        with record_function("zerolite::all_to_all_quantized"):
            w_codes = dist.all_to_all_single(recv_codes, codes, async_op=True)
            w_scales = dist.all_to_all_single(recv_scales, scales, async_op=True)
        self.wire.add("all_to_all", "all_to_all", codes.numel() * codes.element_size()
                      + scales.numel() * scales.element_size(), world=parts)
        if self.error_feedback:
            # Computed while the all-to-alls are in flight.
            sent = _dequantize_chunks(codes, scales, self.bits, self.block_size, n)
            res = (chunks - sent).reshape(-1)
            if not bool(torch.isfinite(res).all()):
                res = torch.zeros_like(res) if not bool(torch.isfinite(grad).all()) \
                    else torch.nan_to_num(res, nan=0.0, posinf=0.0, neginf=0.0)
            self._residuals[flat] = res
        bits, bs, world = self.bits, self.block_size, self.world_size

        def finish(_):
            total = dequantize_sum(recv_codes, recv_scales, bits, bs, n)
            return total.div_(world)

        return PendingReduce(_Works(w_codes, w_scales), None, finish)


class QuantizedParamGatherer(ParamGatherer):
    """qwZ: int8 block-quantized all-gather of the compute-dtype parameter shards.

    ZeRO++ quantizes only the forward all-gathers; zerolite applies it to every gather of a
    unit from the primary shards, so the backward re-gathers (stage 3) are quantized too --
    forward and backward then see the same weights. With hpZ, a gather from the secondary
    shards is exact (ParamGatherer.start): they are slices of the forward's dequantized
    buffer, so backward again sees the forward's weights. Checkpoints and `gather_full_state_dict` use the exact
    `gather_full_flat`.
    `start` returns an object whose `wait()` waits for the codes and scales and then
    dequantizes every rank's chunk (this rank's too, so all ranks compute with identical
    weights) into `flat.full`. Stage 0 (`partitions == 1`) copies exactly.
    """

    def __init__(self, bits: int = 8, block_size: int = 256, wire=None, secondary=None,
                 group=None):
        super().__init__(wire=wire, secondary=secondary, group=group)
        check_args(bits, block_size)
        self.bits, self.block_size = bits, block_size

    def _start_from_shards(self, flat, fetch: bool = False):
        full = flat.alloc_full()
        if flat.partitions == 1:
            return None  # the shard is the full buffer (FlatParam.full_is_shard)
        parts, n = flat.partitions, flat.shard_numel
        codes, scales = quantize_chunks(flat.shard.reshape(1, -1), self.bits, self.block_size)
        all_codes = torch.empty((parts, codes.shape[1]), dtype=codes.dtype, device=codes.device)
        all_scales = torch.empty((parts, scales.shape[1]), dtype=scales.dtype,
                                 device=scales.device)
        w_codes = all_gather_flat(all_codes.view(-1), codes.reshape(-1), group=self.group,
                                  async_op=True)
        w_scales = all_gather_flat(all_scales.view(-1), scales.reshape(-1), group=self.group,
                                   async_op=True)
        self.wire.add("all_gather", "all_gather", codes.numel() * codes.element_size()
                      + scales.numel() * scales.element_size(), world=parts)
        return _PendingGather(_Works(w_codes, w_scales), flat, all_codes, all_scales,
                              self.bits, self.block_size, n)


class _PendingGather:
    """An in-flight quantized gather; `wait()` fills `flat.full` (once)."""

    def __init__(self, works, flat, codes, scales, bits, block_size, n):
        self._works, self._flat = works, flat
        self._args = (codes, scales, bits, block_size, n)

    def is_completed(self) -> bool:
        return self._works.is_completed()

    def wait(self, timeout=None):
        if self._args is None:
            return True
        self._works.wait()
        codes, scales, bits, block_size, n = self._args
        self._args = None
        full = self._flat.full
        with record_function("zerolite::dequantize_gather"):
            full.view(codes.shape[0], n).copy_(
                _dequantize_chunks(codes, scales, bits, block_size, n, out_dtype=full.dtype))
        return True
