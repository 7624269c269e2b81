"""Prefetch and residency knobs: same numbers with prefetch on and off, no hang when the
unit order changes between steps, and the budgets are respected (engine's own accounting)."""
import pytest
import torch

import zerolite
from zerolite.models import GPT, GPTConfig
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, adamw, batches, ds_config

CFG4 = GPTConfig(vocab_size=256, seq_len=16, n_layer=4, n_head=2, d_model=32)
STEPS = 8


def gpt4():
    torch.manual_seed(0)
    return GPT(CFG4)


def _config(world, gas=2, **zero):
    cfg = ds_config(world, gas=gas)
    cfg["zero_optimization"].update(zero)
    return cfg


def _train(rank, world, zero, gas=2, steps=STEPS):
    model = gpt4()
    engine, *_ = zerolite.initialize(model=model, config=_config(world, gas, **zero))
    stats = []
    losses = []
    for batch in batches(steps):
        losses += train_engine(engine, [batch], rank, world)
        stats.append(engine.last_step_stats.as_dict())
    res = engine.sharded.residency
    return (losses, gather_full_state_dict(engine.sharded), stats, res.peak_live_numel,
            res.numels, engine.sharded.gathered_nbytes())


@pytest.mark.parametrize("world", [2, 4])
def test_prefetch_on_and_off_give_identical_numbers(world):
    off = run_ranks(_train, world, {"stage3_prefetch_bucket_size": 0})[0]
    on = run_ranks(_train, world, {"stage3_prefetch_bucket_size": 10**9})[0]
    assert on[0] == off[0]  # bitwise: prefetch changes when, not what
    for name in off[1]:
        assert torch.equal(on[1][name], off[1][name]), name
    assert sum(s["prefetched"] for s in on[2]) > 0
    assert sum(s["prefetched"] for s in off[2]) == 0


def test_live_budget_is_respected():
    numels = run_ranks(_train, 2, {}, 1, 1)[0][4]
    root, block = numels[0], max(numels[1:])
    budget = root + 2 * block  # room for the root, the unit in use and one prefetch
    _, _, stats, peak, _, _ = run_ranks(_train, 2, {"stage3_prefetch_bucket_size": 10**9,
                                                    "stage3_max_live_parameters": budget})[0]
    assert peak <= budget
    assert sum(s["prefetched"] for s in stats) > 0
    # and without a budget the same run holds more at once
    _, _, _, unbounded_peak, _, _ = run_ranks(_train, 2, {"stage3_prefetch_bucket_size": 10**9})[0]
    assert unbounded_peak > budget


def test_reuse_distance_keeps_units_for_backward():
    strict = run_ranks(_train, 2, {"stage3_prefetch_bucket_size": 0}, 1, 3)[0][2][-1]
    keep = run_ranks(_train, 2, {"stage3_prefetch_bucket_size": 0,
                                 "stage3_max_reuse_distance": 10**9}, 1, 3)[0][2][-1]
    # strict: root once + each of 4 blocks in forward and again in backward
    assert strict["gathers"] == 1 + 2 * 4
    assert keep["gathers"] == 1 + 4  # blocks kept from forward into their backward


def test_persistent_units_stay_gathered():
    losses, _, stats, _, numels, gathered = run_ranks(
        _train, 2, {"stage3_param_persistence_threshold": max(numels_of_gpt4())})[0]
    assert gathered > 0  # persistent units stay gathered between steps
    ref_losses, _ = train_reference(gpt4(), batches(STEPS), adamw, clip=CLIP)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)


def numels_of_gpt4():
    return run_ranks(_train, 1, {}, 1, 1)[0][4]


class BranchyGPT(GPT):
    """Every other step skips block 1 and runs block 3 before block 2: the unit order
    changes from one step to the next (same on every rank)."""

    odd = False

    def forward(self, idx, targets=None):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        order = (0, 3, 2) if self.odd else (0, 1, 2, 3)
        for i in order:
            x = self.blocks[i](x)
        logits = self.lm_head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def branchy():
    torch.manual_seed(0)
    return BranchyGPT(CFG4)


def _train_branchy(rank, world):
    model = branchy()
    engine, *_ = zerolite.initialize(model=model,
                                     config=_config(world, stage3_prefetch_bucket_size=10**9))
    losses = []
    for step, batch in enumerate(batches(STEPS)):
        model.odd = step % 2 == 1
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, 2):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / (world * 2))
    return losses, engine.sharded.residency.scheduler.order_changes


def test_order_changing_every_other_step_trains_correctly():
    model = branchy()
    opt = adamw(model.parameters())
    ref = []
    for step, (x, y) in enumerate(batches(STEPS)):
        model.odd = step % 2 == 1
        loss = model(x, y)
        loss.backward()
        for p in model.parameters():  # the branch not taken: zeros, as DeepSpeed's ZeRO steps it
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        from zerolite.optim.grad_norm import clip_grads_
        clip_grads_([p.grad for p in model.parameters() if p.grad is not None], CLIP)
        opt.step()
        opt.zero_grad()
        ref.append(loss.item())
    losses, changes = run_ranks(_train_branchy, 2, timeout_s=60)[0]
    assert changes >= STEPS - 2
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-5, atol=0)


def _breakdown(rank, world):
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("zerolite").addHandler(handler)
    logging.getLogger("zerolite").setLevel(logging.INFO)
    cfg = _config(world)
    cfg.update(wall_clock_breakdown=True, steps_per_print=2)
    engine, *_ = zerolite.initialize(model=gpt4(), config=cfg)
    losses = train_engine(engine, batches(2), rank, world)
    return records, engine.last_step_stats.as_dict(), engine.monitor.last_logged, losses


def test_wall_clock_breakdown_logs_compute_and_comm():
    records, stats, logged, losses = run_ranks(_breakdown, 2)[0]
    # the logged loss is the mean over ranks and micro-batches of the logged step
    assert logged["loss"] == pytest.approx(losses[-1], rel=1e-12)
    lines = [r for r in records if "all_gather" in r and "compute" in r]
    assert len(lines) == 1 and "step 2" in lines[0], records
    assert any("forward" in r and "backward" in r and "rss" in r for r in records), records
    assert stats["compute_s"] > 0 and stats["gathers"] > 0
