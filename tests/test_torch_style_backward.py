"""`loss.backward()` instead of `engine.backward(loss)`, as DeepSpeed >= 0.18 allows: the
gradient accumulation scaling, the boundary and the end-of-backward work happen without the
engine's call, and fp16 needs `engine.scale(loss).backward()` (or raises, as DeepSpeed does).
World 2, gradient accumulation 2, against the plain single-process run on the same global
batches; a program that calls loss.backward() today must not silently train on gas-times
larger gradients."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_reference

from gpt_cases import batches, ds_config, tiny_gpt

STEPS = 4
SGD_LR = 0.3


def _sgd_config(world, stage):
    config = ds_config(world, stage=stage, gradient_clipping=0.0)
    config["optimizer"] = {"type": "SGD", "params": {"lr": SGD_LR}}
    config["zero_allow_untested_optimizer"] = True  # SGD at a ZeRO stage, as DeepSpeed asks
    return config


def _train(engine, rank, world, backward):
    gas = engine.gradient_accumulation_steps()
    losses = []
    for batch in batches(STEPS):
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, gas):
            loss = backward(engine, x, y)
            engine.step()
            total += loss.item()
        dist.all_reduce(total)
        losses.append(total.item() / (world * gas))
    return losses


def _loss_backward(engine, x, y):
    loss = engine(x, y)
    loss.backward()
    return loss


def _logits_then_loss(engine, x, y):
    """The loss is computed outside the engine's forward from the logits it returned."""
    logits = engine(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    return loss


def _mixed(engine, x, y):
    """engine.backward and loss.backward alternating inside one accumulation window."""
    loss = engine(x, y)
    if engine.micro_steps % 2:
        loss.backward()
    else:
        engine.backward(loss)
    return loss


WAYS = {"loss.backward": _loss_backward, "logits_then_loss": _logits_then_loss,
        "mixed": _mixed}


def _run(rank, world, stage, way):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=_sgd_config(world, stage))
    losses = _train(engine, rank, world, WAYS[way])
    return losses, engine.global_steps, engine.micro_steps


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("way", sorted(WAYS))
def test_loss_backward_trains_like_engine_backward(stage, way):
    ref_losses, _ = train_reference(tiny_gpt(), batches(STEPS),
                                    lambda ps: torch.optim.SGD(ps, lr=SGD_LR), clip=0.0)
    losses, global_steps, micro_steps = run_ranks(_run, 2, stage, way)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    assert (global_steps, micro_steps) == (STEPS, 2 * STEPS)


FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12}


def _fp16(rank, world, way):
    config = _sgd_config(world, 3)
    config["fp16"] = FP16
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=config)
    if way == "unscaled":
        x, y = rank_micro_batches(batches(1)[0], rank, world, 2)[0]
        try:
            engine(x, y).backward()
        except RuntimeError as e:
            return str(e)
        return None

    def scaled(engine, x, y):
        loss = engine(x, y)
        engine.scale(loss).backward()
        return loss

    def engine_backward(engine, x, y):
        loss = engine(x, y)
        engine.backward(loss)
        return loss

    return _train(engine, rank, world, scaled if way == "scale" else engine_backward)


def test_fp16_loss_backward_needs_engine_scale_and_then_matches_engine_backward():
    message = run_ranks(_fp16, 2, "unscaled")[0]
    assert message is not None and "engine.scale(loss).backward()" in message
    scaled = run_ranks(_fp16, 2, "scale")[0]
    plain = run_ranks(_fp16, 2, "engine_backward")[0]
    torch.testing.assert_close(torch.tensor(scaled), torch.tensor(plain), rtol=1e-6, atol=0)
