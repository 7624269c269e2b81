"""A trainable parameter that gets no gradient in a step (unused, or frozen after initialize):
DeepSpeed's ZeRO optimizers and its fp16/bf16 wrappers step it with a zero gradient (weight
decay and the moments move it); its plain torch optimizer at stage 0 in fp32 leaves it
(sharded_model.zero_missing_grads; DeepSpeed itself is compared in test_ds_conformance.py,
scenarios unused_parameters and requires_grad_changed_after_initialize)."""
import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.testing.multiprocess import run_ranks


def _frozen_layer_moves(rank, world, stage, bf16):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    cfg = {"train_batch_size": 2 * world,
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "bf16": {"enabled": bf16}}
    engine, *_ = zerolite.initialize(model=model, config=cfg)
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.randn(2, 4).to(dtype)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    engine.module[0].requires_grad_(False)  # frozen after initialize: no gradient from now on
    from zerolite.zero import GatheredParameters
    with GatheredParameters(list(engine.module[0].parameters())):
        before = engine.module[0].weight.detach().float().clone()
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    with GatheredParameters(list(engine.module[0].parameters())):
        after = engine.module[0].weight.detach().float().clone()
    return not torch.equal(before, after)


@pytest.mark.parametrize("stage, bf16, moves", [
    (0, False, False), (0, True, True), (1, False, True), (2, False, True), (3, False, True),
    (3, True, True)])
def test_a_parameter_without_gradient_is_stepped_with_zeros(stage, bf16, moves):
    assert run_ranks(_frozen_layer_moves, 2, stage, bf16)[0] is moves
