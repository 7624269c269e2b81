"""The one GPT workload every engine runs: sizes, batches, optimizer, clipping, machine info."""
from __future__ import annotations

import math
import os
import platform
from dataclasses import asdict, dataclass

import torch

from zerolite.models import GPTConfig
from zerolite.testing.reference import make_token_batches

SEQ_LEN = 128
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.0
CLIP = 1.0
SEED = 0


@dataclass(frozen=True)
class Size:
    name: str
    n_layer: int
    n_head: int
    d_model: int
    global_batch: int
    """Fixed per size (strong scaling): every world size and the reference see the same
    global batches; each rank takes rows [rank*B/W, (rank+1)*B/W)."""
    ref_steps: int | None = None
    """Reference steps to compute (None: all); big sizes only check the first few."""

    def gpt_config(self) -> GPTConfig:
        return GPTConfig(vocab_size=256, seq_len=SEQ_LEN, n_layer=self.n_layer,
                         n_head=self.n_head, d_model=self.d_model)


# global_batch 8 -> micro-batch 4 per rank at world 2: ~1-2 s per step at 20M on 2 cores.
SIZES = {
    "tiny": Size("tiny", n_layer=2, n_head=2, d_model=64, global_batch=4),
    "20M": Size("20M", n_layer=11, n_head=6, d_model=384, global_batch=8),
    "80M": Size("80M", n_layer=11, n_head=12, d_model=768, global_batch=8, ref_steps=3),
    "300M": Size("300M", n_layer=24, n_head=16, d_model=1024, global_batch=8, ref_steps=2),
}


def global_batches(size: Size, steps: int):
    return make_token_batches(steps, size.global_batch, SEQ_LEN, vocab=256, seed=SEED)


def rank_slice(batch, rank: int, world: int):
    x, y = batch
    if x.shape[0] % world:
        raise ValueError(f"global batch {x.shape[0]} not divisible by world {world}")
    per = x.shape[0] // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def build_model(size: Size):
    """Same seed on every rank -> identical initial weights everywhere."""
    from zerolite.models import GPT

    torch.manual_seed(SEED)
    return GPT(size.gpt_config())


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)


def clip_fp64_(grads, max_norm: float = CLIP, group=None, distributed: bool = False) -> float:
    """Clip by the global L2 norm with the sum of squares accumulated in float64 (what
    DeepSpeed and zerolite do). `grads` are local tensors (full grads for DDP, local shards
    for FSDP2 with `distributed=True`, which all-reduces the sum over ranks)."""
    grads = [g for g in grads if g is not None]
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        total += g.detach().double().pow(2).sum()
    if distributed:
        torch.distributed.all_reduce(total, group=group)
    norm = math.sqrt(total.item())
    if math.isfinite(norm) and max_norm > 0:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import psutil

        mem_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # pragma: no cover
        mem_gib = None
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem_gib,
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def size_info(size: Size) -> dict:
    cfg = size.gpt_config()
    return {**asdict(size), "params": cfg.num_params(), "seq_len": SEQ_LEN}
