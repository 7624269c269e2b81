"""The full-buffer pool: reused across units and steps, bounded, and never read through a
stale saved view (autograd's saved views of released params are redirected)."""
import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine
from zerolite.zero.buffer_pool import BufferPool
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import GAS, batches, ds_config, reference_run, tiny_gpt

STEPS = 6


def _train(rank, world, direct_call):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world))
    pool = engine.sharded.pool
    created = []
    if direct_call:  # the module called directly, not through engine(...)
        losses = []
        for batch in batches(STEPS):
            total = torch.zeros((), dtype=torch.float64)
            for x, y in rank_micro_batches(batch, rank, world, GAS):
                loss = engine.module(x, y)
                engine.backward(loss)
                engine.step()
                total += loss.item()
            torch.distributed.all_reduce(total)
            losses.append(total.item() / (world * GAS))
            created.append(pool.created)
    else:
        losses = []
        for batch in batches(STEPS):
            losses += train_engine(engine, [batch], rank, world)
            created.append(pool.created)
    units = engine.sharded.units
    return {"losses": losses, "params": gather_full_state_dict(engine.sharded),
            "created": created, "reused": pool.reused,
            "redirected": engine.sharded.saved_views.redirected,
            "held_bytes": pool.held_bytes(), "created_bytes": pool.created_bytes,
            "unit_bytes": sorted(u.full_nbytes for u in units),
            "grad_bytes": sorted(4 * f.padded_numel for u in units for f in u.trainable_flats)}


@pytest.mark.parametrize("direct_call", [False, True])
def test_pooled_buffers_match_reference_and_stay_bounded(direct_call):
    ref_losses, ref_params = reference_run(STEPS)
    res = run_ranks(_train, 2, direct_call)
    for rank, r in enumerate(res):
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref_losses),
                                   rtol=1e-5, atol=0, msg=lambda m: f"rank {rank}: {m}")
        for name in ref_params:
            torch.testing.assert_close(r["params"][name], ref_params[name], rtol=1e-5,
                                       atol=1e-5, msg=lambda m: f"{name}: {m}")
        if direct_call:
            continue  # buffers are dropped, not reused, while saved views may pin them
        assert r["redirected"] > 0  # saved weight views were taken and redirected
        # No buffer is created after the first step: every later gather and gradient
        # buffer is a reused one.
        assert r["created"][1:] == [r["created"][0]] * (STEPS - 1), r["created"]
        assert r["reused"] > 0
        # Bounded by what one step has alive at once: fewer buffers than one gathered
        # and one gradient buffer per unit (2 blocks + root here: release after use).
        all_units = sum(r["unit_bytes"]) + sum(r["grad_bytes"])
        assert r["created_bytes"] < all_units, (r["created_bytes"], all_units)


def test_pool_reuses_by_size_and_drops_while_blocked():
    pool = BufferPool()
    a = pool.take(10, torch.float32, "cpu", owner="flat-a")
    assert pool.owner_of(a[2:5]) == "flat-a" and pool.owner_of(torch.zeros(3)) is None
    pool.give(a)
    assert pool.owner_of(a) is None
    b = pool.take(10, torch.float32, "cpu")
    assert b.data_ptr() == a.data_ptr() and (pool.created, pool.reused) == (1, 1)
    c = pool.take(10, torch.bfloat16, "cpu")  # other dtype: a new buffer
    assert pool.created == 2
    pool.reuse_blocked = True
    pool.give(b)
    pool.give(c)
    assert pool.held_bytes() == 0  # dropped, not kept
    pool.reuse_blocked = False
    pool.give(pool.take(4, torch.float32, "cpu"))
    assert pool.held_bytes() == 16
