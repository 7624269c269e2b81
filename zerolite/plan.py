"""Step-time model: compute vs communication per optimizer step, for DDP, ZeRO-3 and ZeRO++.

Pure arithmetic (no torch, no torch.distributed): `zerolite plan` prints it, tests check its
byte counts against what the engine sends, and docs/plan.md shows its predictions.

Model (every number below is an input with a default, stated in the output):

- Compute: `6 * Ψ * T / (peak * MFU)` per optimizer step, Ψ parameters, T tokens per GPU
  per step (forward 2ΨT, backward 4ΨT; attention's FLOPs are not counted). Forward is 1/3 of
  it, backward 2/3.
- Bytes are what one GPU sends per optimizer step, counted like zerolite's
  `comm.wire_bytes` (all-gather: its shard to N-1 ranks; reduce-scatter / all-to-all: the
  N-1 chunks of other ranks; all-reduce: twice the reduce-scatter), with zerolite's padding:
  every unit is a flat padded to `ceil(numel / N) * N` elements. ZeRO-3 gathers every unit
  in forward and re-gathers it in backward, except the root unit (embeddings, final norm),
  which stays gathered from its forward to its backward; gathers and gradient reductions
  happen every micro-step. DDP all-reduces once per optimizer step (`no_sync` while
  accumulating).
- Intra vs inter-node, GPUs node-major, g per node, k = N / g nodes:
  ring collectives (all-gather, reduce-scatter, all-reduce) run as g rings in parallel, one
  per NIC ("rail"), as NCCL does; each GPU sends 1/g of its ring bytes across a node
  boundary and the rest over NVLink. Equivalently the node's g NICs carry the ring's
  traffic together. One-hop all-to-all: the chunks for the N - g ranks of other nodes cross.
  Hierarchical all-to-all (ZeRO++'s qgZ): an intra-node all-to-all of the quantized
  gradient, a local sum, then an all-to-all of the node-summed slice (1/g of the buffer)
  with the same local rank of the other k - 1 nodes.
- Times are bandwidth only (no latency term: messages are large): a ring collective takes
  `max(intra / B_intra, inter / B_inter)` (its links run at once), the two hops of the
  hierarchical all-to-all add up.
- Overlap: collectives run on their own streams next to compute. Forward gathers hide
  behind forward compute, backward gathers and gradient reductions behind backward compute;
  what does not fit is exposed: `exposed = max(0, comm_fwd - compute_fwd) + max(0, comm_bwd -
  compute_bwd)`, `step = compute + exposed`. Collectives of one phase share the links
  (their times add). The first gather and the last reduction, which nothing can hide, are
  not counted (1/L of the volume).
- Schemes: `ddp` (all-reduce of gradients); `zero3`; `zero3+hpz` (secondary partition of
  size hpz inside a node: the backward all-gather stays in the node, hpz ranks, from 1/hpz
  shards); `zero3+qwz+qgz` (int8 block-quantized weight all-gathers in forward and backward,
  ZeRO++'s hierarchical quantized gradient all-to-all); `zero3+qwz+qgz(1hop)` (what
  zerolite runs today: one all-to-all of quantized gradient chunks over all ranks); `zero++`
  (qwZ forward, hpZ backward, hierarchical qgZ: ZeRO++ as published). Quantized bytes: codes
  of the block-padded length plus a 4-byte fp32 scale per block (zerolite's format).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

GB = 1e9
SCHEMES = ("ddp", "zero3", "zero3+hpz", "zero3+qwz+qgz", "zero3+qwz+qgz(1hop)", "zero++")


@dataclass(frozen=True)
class Unit:
    """One ZeRO-3 unit: a flat of `numel` parameters."""
    numel: int
    regathered: bool = True
    """Gathered again in backward (False: the root unit, kept from forward to backward)."""


@dataclass(frozen=True)
class Cluster:
    gpus: int = 8
    gpus_per_node: int = 8
    intra_gbps: float = 450.0
    """NVLink GB/s per GPU per direction (H100/H200 NVLink 4: 900 GB/s bidirectional)."""
    inter_gbps: float = 50.0
    """Inter-node GB/s per GPU per direction (one 400 Gb/s NIC per GPU)."""
    peak_tflops: float = 989.0
    """Dense bf16 peak per GPU (H100/H200 SXM)."""
    mfu: float = 0.4


@dataclass(frozen=True)
class Workload:
    units: tuple[Unit, ...]
    tokens_per_gpu: int = 4096
    """Tokens each GPU processes per optimizer step (all micro-steps)."""
    micro_steps: int = 1
    """Gradient accumulation steps: ZeRO-3 gathers and reduces once per micro-step."""
    param_bytes: int = 2
    """Bytes per parameter element gathered (2: bf16/fp16, 4: fp32)."""
    grad_bytes: int = 2
    """Bytes per gradient element reduced (communication_data_type; both engines default to
    the compute dtype)."""
    hpz: int | None = None
    """hpZ secondary partition size; None = GPUs per node."""
    qwz_bits: int = 8
    qgz_bits: int = 4
    block_size: int = 256

    @property
    def params(self) -> int:
        return sum(u.numel for u in self.units)


@dataclass
class Collective:
    scheme: str
    name: str
    phase: str
    """"forward" or "backward": the compute it can hide behind."""
    group: int
    """Ranks taking part."""
    intra_bytes: int
    inter_bytes: int
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return self.intra_bytes + self.inter_bytes


@dataclass
class SchemeResult:
    scheme: str
    collectives: list[Collective] = field(default_factory=list)
    compute_s: float = 0.0
    comm_fwd_s: float = 0.0
    comm_bwd_s: float = 0.0
    exposed_s: float = 0.0
    step_s: float = 0.0
    hidden: bool = True
    break_even_tokens: int = 0
    """Smallest tokens per GPU per step at which all communication hides (same micro-steps)."""

    @property
    def intra_bytes(self) -> int:
        return sum(c.intra_bytes for c in self.collectives)

    @property
    def inter_bytes(self) -> int:
        return sum(c.inter_bytes for c in self.collectives)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["collectives"] = [dict(asdict(c), bytes=c.bytes) for c in self.collectives]
        d.update(intra_bytes=self.intra_bytes, inter_bytes=self.inter_bytes,
                 bytes=self.intra_bytes + self.inter_bytes)
        return d


# -- shapes ---------------------------------------------------------------------------------
def gpt_units(layers: int, d_model: int, vocab: int, seq: int, tied: bool = True) -> tuple:
    """zerolite's GPT (zerolite.models.GPT) as units: the root (token + position embeddings,
    final LayerNorm, the LM head when untied) and one unit per block of 12d² + 13d."""
    d = d_model
    root = vocab * d + seq * d + 2 * d + (0 if tied else vocab * d)
    return (Unit(root, regathered=False),) + (Unit(12 * d * d + 13 * d),) * layers


def params_units(params: int) -> tuple:
    """A model given only by its size: one unit, re-gathered in backward."""
    return (Unit(int(params)),)


# -- bytes ----------------------------------------------------------------------------------
def shard_numel(numel: int, partitions: int) -> int:
    """zerolite.zero.shard_math.shard_numel (elements per rank, the flat padded to N)."""
    return max(1, math.ceil(numel / partitions))


def quantized_nbytes(numel: int, bits: int, block_size: int) -> int:
    """Wire bytes of `numel` quantized elements: codes for the block-padded length + one fp32
    scale per block (triton_kernels.dispatch.quantized_nbytes)."""
    nb = math.ceil(numel / block_size)
    return nb * block_size * bits // 8 + nb * 4


def ring_split(nbytes: int, n: int, g: int) -> tuple[int, int]:
    """(intra, inter) of `nbytes` a GPU sends in a ring collective over n ranks, g per node:
    g rings, one per rail, each crossing a node boundary at a different GPU, so 1/g of the
    bytes leave the node (none on one node)."""
    if n <= g:
        return nbytes, 0
    inter = nbytes // g
    return nbytes - inter, inter


def all_gather_bytes(units, n: int, elem_bytes: int, only_regathered: bool = False) -> int:
    """An all-gather of every unit's shard: (n - 1) * shard bytes (wire_bytes("all_gather"))."""
    return sum((n - 1) * shard_numel(u.numel, n) * elem_bytes for u in units
               if u.regathered or not only_regathered) if n > 1 else 0


def secondary_gather_bytes(units, n: int, hpz: int, elem_bytes: int) -> int:
    """hpZ's backward all-gather over hpz ranks of every re-gathered unit: each rank's
    secondary shard, 1/hpz of the flat padded for n ranks (as zerolite cuts it), to hpz - 1
    ranks."""
    return sum((hpz - 1) * shard_numel(u.numel, n) * n // hpz * elem_bytes for u in units
               if u.regathered) if hpz > 1 else 0


def reduce_scatter_bytes(units, n: int, elem_bytes: int) -> int:
    """Reduce-scatter of every unit's padded gradient: (n - 1) / n of it."""
    return sum((n - 1) * shard_numel(u.numel, n) * elem_bytes for u in units) if n > 1 else 0


def qwz_bytes(units, n: int, bits: int, block: int, only_regathered: bool = False) -> int:
    """Quantized all-gather: each rank's quantized shard to n - 1 ranks."""
    return sum((n - 1) * quantized_nbytes(shard_numel(u.numel, n), bits, block) for u in units
               if u.regathered or not only_regathered) if n > 1 else 0


# -- the model ------------------------------------------------------------------------------
def _collectives(scheme: str, w: Workload, c: Cluster) -> list[Collective]:
    n, g = c.gpus, min(c.gpus_per_node, c.gpus)
    k, ms, units = n // g, w.micro_steps, w.units
    hpz = w.hpz or g
    out: list[Collective] = []

    def ring(name, phase, group, nbytes):
        intra, inter = ring_split(nbytes, group, g)
        out.append(Collective(scheme, name, phase, group, intra, inter))

    if scheme == "ddp":
        ring("all_reduce grads", "backward", n,
             2 * (n - 1) * w.params * w.grad_bytes // n if n > 1 else 0)
        return out
    quant_w = scheme in ("zero3+qwz+qgz", "zero3+qwz+qgz(1hop)", "zero++")
    if quant_w:
        ring(f"all_gather fwd (qwZ int{w.qwz_bits})", "forward", n,
             ms * qwz_bytes(units, n, w.qwz_bits, w.block_size))
    else:
        ring("all_gather fwd", "forward", n, ms * all_gather_bytes(units, n, w.param_bytes))
    if scheme in ("zero3+hpz", "zero++"):
        # Secondary partition over hpz ranks of one node: the whole gather stays inside it.
        nbytes = ms * secondary_gather_bytes(units, n, hpz, w.param_bytes)
        out.append(Collective(scheme, f"all_gather bwd (hpZ {hpz})", "backward", hpz, nbytes, 0))
    elif quant_w:
        ring(f"all_gather bwd (qwZ int{w.qwz_bits})", "backward", n,
             ms * qwz_bytes(units, n, w.qwz_bits, w.block_size, only_regathered=True))
    else:
        ring("all_gather bwd", "backward", n,
             ms * all_gather_bytes(units, n, w.param_bytes, only_regathered=True))
    bits, block = w.qgz_bits, w.block_size
    if scheme == "zero3+qwz+qgz(1hop)":
        # zerolite's qgZ: chunk r of the padded gradient, quantized, goes to rank r.
        per_chunk = [quantized_nbytes(shard_numel(u.numel, n), bits, block) for u in units]
        if n > 1:
            out.append(Collective(scheme, f"all_to_all grads (qgZ int{bits}, 1 hop)", "backward",
                                  n, ms * (g - 1) * sum(per_chunk),
                                  ms * (n - g) * sum(per_chunk)))
    elif scheme in ("zero3+qwz+qgz", "zero++"):
        # ZeRO++: all-to-all inside the node (g chunks of k shards), sum, then the node's
        # slice (k shards) to the same local rank of every other node.
        intra = sum((g - 1) * quantized_nbytes(k * shard_numel(u.numel, n), bits, block)
                    for u in units)
        inter = sum((k - 1) * quantized_nbytes(shard_numel(u.numel, n), bits, block)
                    for u in units) if k > 1 else 0
        if n > 1:
            out.append(Collective(scheme, f"all_to_all grads (qgZ int{bits}, 2 hops)",
                                  "backward", n, ms * intra, ms * inter))
    else:
        ring("reduce_scatter grads", "backward", n,
             ms * reduce_scatter_bytes(units, n, w.grad_bytes))
    return out


def plan_scheme(scheme: str, w: Workload, c: Cluster) -> SchemeResult:
    """Bytes, times and overlap of one scheme (see the module docstring for the model)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: expected one of {SCHEMES}")
    check(w, c)
    bi, be = c.intra_gbps * GB, c.inter_gbps * GB
    r = SchemeResult(scheme, _collectives(scheme, w, c))
    for col in r.collectives:
        if "2 hops" in col.name:  # the two hops run one after the other
            col.seconds = col.intra_bytes / bi + col.inter_bytes / be
        else:
            col.seconds = max(col.intra_bytes / bi, col.inter_bytes / be)
    flops_per_s = c.peak_tflops * 1e12 * c.mfu
    r.compute_s = 6 * w.params * w.tokens_per_gpu / flops_per_s
    fwd, bwd = r.compute_s / 3, 2 * r.compute_s / 3
    r.comm_fwd_s = sum(col.seconds for col in r.collectives if col.phase == "forward")
    r.comm_bwd_s = sum(col.seconds for col in r.collectives if col.phase == "backward")
    r.exposed_s = max(0.0, r.comm_fwd_s - fwd) + max(0.0, r.comm_bwd_s - bwd)
    r.step_s = r.compute_s + r.exposed_s
    r.hidden = r.exposed_s == 0.0
    # Tokens at which each phase's compute covers its communication.
    need = max(r.comm_fwd_s * flops_per_s / (2 * w.params),
               r.comm_bwd_s * flops_per_s / (4 * w.params))
    r.break_even_tokens = math.ceil(need)
    return r


def check(w: Workload, c: Cluster) -> None:
    if c.gpus < 1 or c.gpus_per_node < 1:
        raise ValueError("gpus and gpus_per_node must be >= 1")
    g = min(c.gpus_per_node, c.gpus)
    if c.gpus % g:
        raise ValueError(f"gpus {c.gpus} is not a multiple of gpus_per_node {c.gpus_per_node}")
    hpz = w.hpz or g
    if g % hpz:
        raise ValueError(f"hpz {hpz} does not divide the GPUs per node ({g})")
    if not 0 < c.mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {c.mfu}")
    if min(c.intra_gbps, c.inter_gbps, c.peak_tflops) <= 0:
        raise ValueError("bandwidths and peak FLOPs must be > 0")
    if w.qgz_bits not in (4, 8) or w.qwz_bits not in (4, 8):
        raise ValueError("qwz_bits and qgz_bits must be 4 or 8")


def plan(w: Workload, c: Cluster, schemes=SCHEMES) -> list[SchemeResult]:
    return [plan_scheme(s, w, c) for s in schemes]


def assumptions(w: Workload, c: Cluster) -> list[str]:
    g = min(c.gpus_per_node, c.gpus)
    return [
        f"compute = 6 * params * tokens / (peak * MFU) = 6 * {w.params:,} * "
        f"{w.tokens_per_gpu:,} / ({c.peak_tflops:g} TFLOP/s * {c.mfu:g}); forward 1/3, "
        "backward 2/3; attention FLOPs not counted",
        f"{c.gpus} GPUs, {g} per node ({c.gpus // g} nodes); intra-node {c.intra_gbps:g} GB/s, "
        f"inter-node {c.inter_gbps:g} GB/s per GPU per direction; bandwidth only, no latency",
        f"bytes = what one GPU sends per optimizer step ({w.micro_steps} micro-step(s); "
        f"params {w.param_bytes} B, grads {w.grad_bytes} B per element); units padded to a "
        "multiple of the group size as zerolite pads them",
        "ring collectives: g rings in parallel (one per NIC), 1/g of a GPU's ring bytes cross "
        "a node boundary; one-hop all-to-all: chunks for other nodes cross; ZeRO++ qgZ: "
        "intra-node all-to-all, then the node-summed 1/g slice across nodes",
        "overlap: forward gathers hide behind forward compute, backward gathers and "
        "reductions behind backward compute; exposed = the excess; DDP all-reduces once per "
        "step",
        f"qwZ int{w.qwz_bits}, qgZ int{w.qgz_bits}, blocks of {w.block_size} with a 4-byte "
        f"scale; hpZ partition {w.hpz or g} (backward all-gather inside the node)",
    ]
