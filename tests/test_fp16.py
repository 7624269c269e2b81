"""fp16 with dynamic loss scaling against an independent single-process fp16 reference (its
own GradScaler-style scaler, torch SGD, torch.linalg.vector_norm); a forced overflow skips
exactly one step. Plain SGD without clipping: a missing or wrong unscale changes every update
(Adam and clipping would hide it)."""
import copy

import torch

import zerolite
from zerolite.optim.loss_scaler import LossScaler
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches

from gpt_cases import batches, ds_config, tiny_gpt

STEPS, OVERFLOW_STEP = 12, 5
SGD_LR = 0.3
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 4,
        "hysteresis": 1, "min_loss_scale": 1}


class _GrowthScaler:
    """torch.amp.GradScaler's rule with DeepSpeed's factors: halve on a non-finite grad and
    skip the step; double after `interval` finite steps in a row."""

    def __init__(self, scale: float, interval: int):
        self.scale, self.interval, self.good = scale, interval, 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale, self.good = max(self.scale / 2, 1.0), 0
            return
        self.good += 1
        if self.good == self.interval:
            self.scale, self.good = self.scale * 2, 0


def _reference():
    """Plain PyTorch mixed precision: fp16 model, fp32 master copies, scaled loss, SGD."""
    model = tiny_gpt()
    half = copy.deepcopy(model).half()
    params = list(half.parameters())
    masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    opt = torch.optim.SGD(masters, lr=SGD_LR)
    scaler = _GrowthScaler(2.0 ** 12, 4)
    losses, norms, skipped = [], [], 0
    for step, (x, y) in enumerate(batches(STEPS)):
        loss = half(x, y)
        boost = 1e30 if step == OVERFLOW_STEP else 1.0
        (loss * scaler.scale * boost).backward()
        grads = [p.grad.float() / scaler.scale for p in params]
        for p in params:
            p.grad = None
        found_inf = not all(torch.isfinite(g).all() for g in grads)
        scaler.update(found_inf)
        losses.append(loss.item())
        if found_inf:
            skipped += 1
            norms.append(float("inf"))
            continue
        norms.append(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])
                                              .double()).item())
        for m, g in zip(masters, grads):
            m.grad = g
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
    return losses, norms, skipped, scaler.scale


def _train(rank, world):
    model = tiny_gpt()
    cfg = ds_config(world, fp16=FP16, gradient_clipping=0.0,
                    optimizer={"type": "SGD", "params": {"lr": SGD_LR}},
                    zero_allow_untested_optimizer=True)
    engine, optimizer, *_ = zerolite.initialize(model=model, config=cfg)
    losses, norms, overflow_seen = [], [], []
    for step, batch in enumerate(batches(STEPS)):
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, engine.gradient_accumulation_steps()):
            loss = engine(x, y)
            engine.backward(loss * (1e30 if step == OVERFLOW_STEP else 1.0))
            engine.step()
            total += loss.item()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / (world * engine.gradient_accumulation_steps()))
        norms.append(float(engine.get_global_grad_norm()))
        overflow_seen.append(optimizer.overflow)
    return losses, norms, engine.skipped_steps, engine.loss_scaler.loss_scale, overflow_seen, \
        engine.global_steps


def test_fp16_dynamic_scaling_matches_reference_and_skips_one_step():
    ref_losses, ref_norms, ref_skipped, ref_scale = _reference()
    losses, norms, skipped, scale, overflow_seen, global_steps = run_ranks(_train, 2)[0]
    assert ref_skipped == skipped == 1
    assert overflow_seen == [i == OVERFLOW_STEP for i in range(STEPS)]
    assert scale == ref_scale == 2.0 ** 13  # 2^12, doubled at step 3, halved at 5, doubled at 9
    assert global_steps == STEPS  # a skipped step still counts, as in DeepSpeed
    # fp16 forward/backward over micro-batches of 2 vs the whole batch of 8 rounds differently:
    # measured max 1e-5 on losses and 5e-5 relative on norms. A missing unscale multiplies
    # the first update by 4096; a norm of the scaled grads is 4096x too large.
    diff = (torch.tensor(losses) - torch.tensor(ref_losses)).abs().max().item()
    assert diff < 2e-4, diff
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), rtol=5e-4, atol=0)


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
        # y.float(): auto_cast makes the targets half too; torch 2.11's mse_loss backward
        # fails on a float/half pair ("Found dtype Half but expected Float"), 2.13's promotes.
        return torch.nn.functional.mse_loss(self.layers(x).float(), y.float())


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
