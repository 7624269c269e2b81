"""fp16 with dynamic loss scaling against a single-process fp16 reference that scales the
same way; a forced overflow skips exactly one step."""
import copy

import torch

import zerolite
from zerolite.optim.grad_norm import clip_grads_
from zerolite.optim.loss_scaler import LossScaler
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches

from gpt_cases import CLIP, LR, WD, batches, ds_config, tiny_gpt

STEPS, OVERFLOW_STEP = 12, 5
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 4,
        "hysteresis": 1, "min_loss_scale": 1}


def _reference():
    """Plain PyTorch mixed precision: fp16 model, fp32 master copies, scaled loss."""
    model = tiny_gpt()
    half = copy.deepcopy(model).half()
    params = list(half.parameters())
    masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    opt = torch.optim.AdamW(masters, lr=LR, weight_decay=WD)
    scaler = LossScaler(initial_scale_power=12, loss_scale_window=4, hysteresis=1)
    losses, skipped = [], 0
    for step, (x, y) in enumerate(batches(STEPS)):
        loss = half(x, y)
        boost = 1e30 if step == OVERFLOW_STEP else 1.0
        (loss * scaler.loss_scale * boost).backward()
        grads = [p.grad.float() for p in params]
        for p in params:
            p.grad = None
        overflow = not all(torch.isfinite(g).all() for g in grads)
        scale = scaler.loss_scale
        scaler.update_scale(overflow)
        losses.append(loss.item())
        if overflow:
            skipped += 1
            continue
        for m, g in zip(masters, grads):
            m.grad = g / scale
        clip_grads_([m.grad for m in masters], CLIP)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
    return losses, skipped, scaler.loss_scale


def _train(rank, world):
    model = tiny_gpt()
    engine, optimizer, *_ = zerolite.initialize(model=model, config=ds_config(world, fp16=FP16))
    losses, overflow_seen = [], []
    for step, batch in enumerate(batches(STEPS)):
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, engine.gradient_accumulation_steps()):
            loss = engine(x, y)
            engine.backward(loss * (1e30 if step == OVERFLOW_STEP else 1.0))
            engine.step()
            total += loss.item()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / (world * engine.gradient_accumulation_steps()))
        overflow_seen.append(optimizer.overflow)
    return losses, engine.skipped_steps, engine.loss_scaler.loss_scale, overflow_seen, \
        engine.global_steps


def test_fp16_dynamic_scaling_matches_reference_and_skips_one_step():
    ref_losses, ref_skipped, ref_scale = _reference()
    losses, skipped, scale, overflow_seen, global_steps = run_ranks(_train, 2)[0]
    assert ref_skipped == skipped == 1
    assert overflow_seen == [i == OVERFLOW_STEP for i in range(STEPS)]
    assert scale == ref_scale
    assert global_steps == STEPS  # a skipped step still counts, as in DeepSpeed
    # fp16 forward/backward over micro-batches of 2 vs the whole batch of 8 rounds differently
    diff = (torch.tensor(losses) - torch.tensor(ref_losses)).abs().max().item()
    assert diff < 5e-3, diff
    assert losses[-1] < losses[0] - 0.1


def test_loss_scaler_sequence():
    s = LossScaler(initial_scale_power=4, loss_scale_window=2, hysteresis=2, min_loss_scale=2)
    seen = []
    for overflow in [False, False, True, True, False, False, True, True, True, True]:
        s.update_scale(overflow)
        seen.append(s.loss_scale)
    # window 2: doubles after 2 clean iters; hysteresis 2: the first overflow is absorbed
    assert seen == [16, 32, 32, 16, 16, 32, 32, 16, 8, 4]
    static = LossScaler(loss_scale=128)
    static.update_scale(True)
    assert static.loss_scale == 128


class _Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.layers(x).float(), y)


def _auto_cast(rank, world, auto_cast):
    torch.manual_seed(0)
    cfg = ds_config(world, fp16={**FP16, "auto_cast": auto_cast})
    engine, *_ = zerolite.initialize(model=_Regression(), config=cfg)
    x, y = torch.randn(2, 8), torch.randn(2, 1)  # fp32 inputs, as a data loader yields them
    try:
        loss = engine(x, y)
    except RuntimeError as err:
        return "error: " + str(err).splitlines()[0]
    engine.backward(loss)
    return loss.dtype


def test_fp16_auto_cast_casts_float_inputs():
    assert run_ranks(_auto_cast, 2, True)[0] == torch.float32  # the loss itself is fp32
    assert run_ranks(_auto_cast, 2, False)[0].startswith("error")
