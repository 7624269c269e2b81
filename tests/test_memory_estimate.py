"""`zerolite check-config`'s per-rank model-state bytes against engine.memory_stats() of a real
2-rank run, at every stage, fp32 and bf16, measured at the accumulation boundary after
backward (gradients complete, before the step frees them)."""
from __future__ import annotations

import pytest
import torch

import zerolite
from zerolite.cli.check_config import estimate_model_state_bytes
from zerolite.testing.multiprocess import run_ranks

from gpt_cases import batches, tiny_gpt


def _measure(rank, world, stage, bf16):
    model = tiny_gpt()
    num_params = sum(p.numel() for p in model.parameters())
    cfg = {"train_batch_size": 8, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                 "stage3_max_reuse_distance": 0},
           "bf16": {"enabled": bf16}}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    x, y = batches(1)[0]
    for step in range(2):  # the second step has Adam's moments allocated
        for micro in range(2):
            lo = 4 * rank + 2 * micro
            engine.backward(engine(x[lo:lo + 2], y[lo:lo + 2]))
            if step == 1 and micro == 1:
                flats = engine.sharded.flats
                grads = sum(f.master.grad.numel() * f.master.grad.element_size()
                            for f in flats if f.master is not None and f.master.grad is not None)
                grads += sum(t.numel() * t.element_size() for f in flats
                             for t in (f.grad_buffer, f.reduced_grad) if t is not None)
                ms = engine.memory_stats()
            engine.step()
    return num_params, grads, ms


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_estimate_matches_memory_stats(stage, bf16):
    num_params, grads, ms = run_ranks(_measure, 2, stage, bf16)[0]
    est = estimate_model_state_bytes(num_params, 2, stage, "bf16" if bf16 else "fp32")
    measured = {"params": ms["gathered"] + ms["param_shards"], "grads": grads,
                "optimizer": ms["master_shards"] + ms["optimizer_state"]}
    # rel 1e-3: Adam's per-flat `step` scalars and shard padding (exact here: 0 bytes)
    for part, value in measured.items():
        assert value == pytest.approx(est[part], rel=1e-3), (part, value, est)
    assert sum(measured.values()) == pytest.approx(est["total"], rel=1e-3)
