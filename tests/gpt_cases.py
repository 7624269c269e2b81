"""Shared set-up for the GPT parity tests: one tiny model, batches, config and reference."""
from __future__ import annotations

import copy
import functools

import torch

from zerolite.models import GPT, GPTConfig
from zerolite.testing.reference import make_token_batches, train_reference

TINY = GPTConfig(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=32)
GLOBAL_BATCH = 8
GAS = 2
STEPS = 20
LR, WD, CLIP = 3e-3, 0.01, 0.05


def tiny_gpt(seed: int = 0, cfg: GPTConfig = TINY) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def batches(steps: int = STEPS):
    return make_token_batches(steps, GLOBAL_BATCH, TINY.seq_len, TINY.vocab_size, seed=1)


def ds_config(world_size: int, stage: int = 3, bf16: bool = False, gas: int = GAS, **extra) -> dict:
    cfg = {
        "train_batch_size": GLOBAL_BATCH,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        "gradient_clipping": CLIP,
        # Strict ZeRO-3 residency for tests (release after every use): nothing persistent,
        # nothing kept for reuse. The knobs themselves are tested in test_prefetch.py.
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                              "stage3_max_reuse_distance": 0},
        "bf16": {"enabled": bf16},
    }
    cfg.update(extra)
    return cfg


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=WD)


@functools.lru_cache(maxsize=None)
def reference_run(steps: int = STEPS, model_fn=None):
    model = (model_fn or tiny_gpt)()
    return train_reference(copy.deepcopy(model), batches(steps), adamw, clip=CLIP)
