"""Top-k sparsified gradients with error feedback (zerolite.sparse_gradients, comm/sparse.py).

The reducer against a by-definition reference (bitwise), the engine at world 2 and 4 with
gradient accumulation 2 and bf16 against a single-process reference that applies the same
per-unit selection and residual, the accumulated error with and without error feedback, the
measured wire bytes, warmup, and the config's refusals.
"""
import copy
import json

import pytest
import torch

import zerolite
from triton_kernels.topk_ref import selected_count, topk_select_ref
from zerolite.cli.check_config import main as check_config_main
from zerolite.comm.build import build_grad_reducer
from zerolite.comm.reducers import GradReducer
from zerolite.comm.sparse import SparseGradReducer, pack_entries
from zerolite.config import load_config
from zerolite.errors import ZeroliteConfigError
from zerolite.optim.grad_norm import clip_grads_
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, GAS, adamw, batches, ds_config, tiny_gpt
from test_quantized_comm import FakeFlat, rank_grads


def _sparse_cfg(world, ratio, ef=True, warmup=0, stage=3, bf16=False, **extra):
    cfg = ds_config(world, stage=stage, bf16=bf16, **extra)
    cfg["zerolite"] = {"sparse_gradients": {"ratio": ratio, "error_feedback": ef,
                                            "warmup_steps": warmup}}
    return cfg


# -- the reducer ------------------------------------------------------------------------
def reference_reduce(all_grads, residuals, ratio, ef, predivide=1.0):
    """Every rank's step by definition: acc = g/predivide + residual, the top-k of acc is sent,
    the rest kept; the owner sums the senders' dense contributions in rank order."""
    world, numel = all_grads.shape
    total = torch.zeros(numel)
    for r in range(world):
        g = all_grads[r] / predivide if predivide != 1.0 else all_grads[r].clone()
        acc = residuals[r] + g if ef else g
        idx, vals, res = topk_select_ref(acc, selected_count(numel, ratio))
        sent = torch.zeros(numel).index_put_((idx.long(),), vals)
        residuals[r] = res if ef else torch.zeros(numel)
        total += sent
    post = predivide / world
    return total * post if post != 1.0 else total


def _reduce_steps(rank, world, shard, ratio, ef, steps, predivide):
    red = SparseGradReducer(world, ratio=ratio, error_feedback=ef, predivide=predivide)
    flat = FakeFlat(rank, world, shard)
    outs = []
    for step in range(steps):
        g = rank_grads(world, shard * world, step)[rank]
        outs.append(red.start(flat, g.clone()).wait())
    res = red.residual(flat)
    return outs, (None if res is None else res.clone()), dict(red.bytes_sent)


@pytest.mark.parametrize("world,predivide", [(2, 1.0), (4, 2.0)])
def test_reducer_matches_definition_bitwise(world, predivide):
    shard, ratio, steps = 1000, 0.02, 3
    results = run_ranks(_reduce_steps, world, shard, ratio, True, steps, predivide)
    residuals = [torch.zeros(shard * world) for _ in range(world)]
    for step in range(steps):
        exact = reference_reduce(rank_grads(world, shard * world, step), residuals, ratio, True,
                                 predivide)
        for r, (outs, _, _) in enumerate(results):
            assert outs[step].dtype == torch.float32 and outs[step].shape == (shard,)
            assert torch.equal(outs[step], exact[r * shard:(r + 1) * shard]), (step, r)
    for r, (_, res, _) in enumerate(results):
        assert torch.equal(res, residuals[r])


def _bytes(rank, world, shard, ratio):
    sparse = SparseGradReducer(world, ratio=ratio)
    dense = GradReducer(world, scatter_method="all_to_all")
    flat = FakeFlat(rank, world, shard)
    g = rank_grads(world, shard * world, 1)[rank]
    sparse.start(flat, g.clone()).wait()
    dense.start(flat, g.clone()).wait()
    idx, vals, _ = topk_select_ref(g.clone(), selected_count(g.numel(), ratio))
    _, counts = pack_entries(idx, vals, world, shard)
    return sparse.bytes_sent["all_to_all"], dense.bytes_sent["all_to_all"], counts


@pytest.mark.parametrize("world", [2, 4])
def test_wire_bytes_are_counted_from_what_is_sent(world):
    shard, ratio = 4000, 0.01
    for r, (sparse, dense, counts) in enumerate(run_ranks(_bytes, world, shard, ratio)):
        to_others = int(counts.sum()) - int(counts[r])
        assert sparse == 8 * to_others + 8 * (world - 1)  # (index, value) pairs + the counts
        assert dense == 4 * shard * (world - 1)
        # at most k entries leave the rank: 2r of the buffer's fp32 bytes, N/(N-1) x that
        # of dense's (N-1)/N, and less when some entries stay home
        assert sparse / dense <= 2 * ratio * world / (world - 1) + 8 * (world - 1) / dense


def _feedback(rank, world, ef, steps):
    shard = 512
    red = SparseGradReducer(world, ratio=0.1, error_feedback=ef)
    flat = FakeFlat(rank, world, shard)
    persistent = torch.randn(world, shard * world, generator=torch.Generator().manual_seed(0))
    total_sparse, total_exact = torch.zeros(shard), torch.zeros(shard)
    for step in range(steps):
        # a persistent gradient component plus fresh noise, as in training
        noise = torch.randn(world, shard * world, generator=torch.Generator().manual_seed(step + 1))
        grads = persistent + 0.3 * noise
        total_exact += grads[:, rank * shard:(rank + 1) * shard].mean(0)
        total_sparse += red.start(flat, grads[rank].clone()).wait()
    return float((total_sparse - total_exact).norm() / total_exact.norm())


def test_error_feedback_keeps_the_accumulated_update_close():
    """Without error feedback, the 90% of entries not sent are lost every step: the summed
    update stays far from the exact sum. With it, they arrive later: the gap is only what the
    residual still holds."""
    steps = 60
    with_ef = run_ranks(_feedback, 2, True, steps)
    without = run_ranks(_feedback, 2, False, steps)
    for err_ef, err_plain in zip(with_ef, without):
        assert err_plain > 0.5, err_plain
        assert err_ef < 0.3 * err_plain, (err_ef, err_plain)


def _nonfinite(rank, world):
    red = SparseGradReducer(world, ratio=0.01)
    flat = FakeFlat(rank, world, 800)
    g = rank_grads(world, 1600, 2)[rank]
    if rank == 1:
        g[5] = float("inf")  # lands in rank 0's shard
        # 60 NaNs with distinct payloads (distinct keys, so no ties): more non-finite values
        # than k = 16, so some stay behind in the residual
        g[900:960] = (torch.arange(60, dtype=torch.int32) + 0x7FC00001).view(torch.float32)
    out = red.start(flat, g).wait()
    ok_res = bool(torch.isfinite(red.residual(flat)).all())
    out2 = red.start(flat, rank_grads(world, 1600, 3)[rank]).wait()
    return out, ok_res, bool(torch.isfinite(out2).all())


def test_nonfinite_gradient_reaches_the_owner_and_resets_the_residual():
    (out0, res0, next0), (out1, res1, next1) = run_ranks(_nonfinite, 2)
    assert bool(torch.isfinite(out0).all())  # the NaNs rank above the inf: it stays behind
    assert int(torch.isnan(out1).sum()) == 16
    assert res0 and res1 and next0 and next1


# -- the engine against a single-process reference ---------------------------------------
RATIO, STEPS = 0.05, 6


def _layout(engine):
    return [([s.names[0] for s in f.slots], [(s.offset, s.numel) for s in f.slots],
             f.padded_numel) for f in engine.sharded.flats if f.master is not None]


def _engine_rank(rank, world, ef, bf16, warmup=0, steps=STEPS):
    model = tiny_gpt()
    cfg = _sparse_cfg(world, RATIO, ef=ef, warmup=warmup, bf16=bf16)
    cfg["optimizer"]["params"]["torch_adam"] = True  # the reference's for-loop AdamW
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses, stats = [], []
    for batch in batches(steps):
        losses += train_engine(engine, [batch], rank, world)
        stats.append(engine.last_step_stats.reduce_bytes)
    return losses, gather_full_state_dict(engine.sharded), _layout(engine), stats


def sparse_reference(model, steps, world, layout, ef, dtype, warmup=0):
    """Plain torch, one process: each rank's micro-batch gradient (in `dtype`, with fp32
    masters as zerolite's bf16 mode), flattened per unit as the engine's layout, the same
    top-k selection and residual per rank and unit, summed in rank order (fp32 values on the
    wire), averaged, accumulated over micro-steps at the precision of `dtype` (DeepSpeed's
    default grad_accum_dtype), float64-norm clipping, torch AdamW."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p, []).append(name)
    masters = {ns[0]: torch.nn.Parameter(p.detach().float().clone()) for p, ns in names.items()}
    alias = {n: ns[0] for ns in names.values() for n in ns}
    work = copy.deepcopy(model).to(dtype)
    wparams = dict(work.named_parameters(remove_duplicate=False))
    opt = adamw(list(masters.values()))
    residuals = {(r, u): torch.zeros(padded) for r in range(world)
                 for u, (_, _, padded) in enumerate(layout)}
    losses = []
    for step, batch in enumerate(batches(steps)):
        flat_grads = [None] * len(layout)
        total = 0.0
        for m in range(GAS):
            per_rank = []
            for r in range(world):
                x, y = rank_micro_batches(batch, r, world, GAS)[m]
                loss = work(x, y)
                (loss / GAS).backward()
                total += loss.float().item()
                flats = []
                for names_u, slots, padded in layout:
                    buf = torch.zeros(padded)
                    for n, (off, num) in zip(names_u, slots):
                        g = wparams[n].grad
                        if g is not None:
                            buf[off:off + num] = g.reshape(-1).float()
                    flats.append(buf)
                per_rank.append(flats)
                work.zero_grad(set_to_none=True)
            for u, (_, _, padded) in enumerate(layout):
                summed = torch.zeros(padded)
                for r in range(world):
                    g = per_rank[r][u]
                    if step < warmup:
                        summed += g
                        continue
                    acc = residuals[(r, u)] + g if ef else g
                    idx, vals, res = topk_select_ref(acc, selected_count(padded, RATIO))
                    residuals[(r, u)] = res if ef else residuals[(r, u)]
                    summed += torch.zeros(padded).index_put_((idx.long(),), vals)
                # kept at the training dtype's precision ([Note: gradient precision])
                shard = summed.mul_(1.0 / world).to(dtype).float()
                flat_grads[u] = shard if flat_grads[u] is None else \
                    flat_grads[u].add_(shard).to(dtype).float()
        for (names_u, slots, _), fg in zip(layout, flat_grads):
            for n, (off, num) in zip(names_u, slots):
                mp = masters[alias[n]]
                mp.grad = fg[off:off + num].view_as(mp).clone()
        clip_grads_([p.grad for p in masters.values()], CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, p in wparams.items():
                p.copy_(masters[alias[n]])
        losses.append(total / (world * GAS))
    return losses, {n: masters[alias[n]].detach().clone() for n in alias}


@pytest.mark.parametrize("world,bf16", [(2, True), (4, True), (2, False)])
def test_engine_matches_sparse_reference(world, bf16):
    losses, params, layout, _ = run_ranks(_engine_rank, world, True, bf16)[0]
    torch.set_num_threads(1)  # the ranks' kernels
    ref_losses, ref_params = sparse_reference(tiny_gpt(), STEPS, world, layout, True,
                                              torch.bfloat16 if bf16 else torch.float32)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-6, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"{name}: {m}")


def test_engine_without_error_feedback_and_with_warmup():
    """error_feedback false drops the residual (the reference drops it too); warmup_steps
    reduces the first steps densely (exact bytes) before sparsifying."""
    world = 2
    (losses, params, layout, stats), _ = run_ranks(_engine_rank, world, False, False, 2)
    torch.set_num_threads(1)
    ref_losses, ref_params = sparse_reference(tiny_gpt(), STEPS, world, layout, False,
                                              torch.float32, warmup=2)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-6, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-6, atol=1e-7)
    dense = sum(padded * 4 // 2 for *_, padded in layout) * GAS  # fp32, (N-1)/N, per micro-step
    assert stats[0] == stats[1] == dense
    assert all(s < 0.15 * dense for s in stats[2:]), stats  # ratio 5%: ~10% of dense + counts


# -- config ------------------------------------------------------------------------------
def test_config_builds_the_sparse_reducer_and_refuses_bad_combinations():
    red = build_grad_reducer(load_config(_sparse_cfg(2, 0.001, warmup=3), 2), 2)
    assert isinstance(red, SparseGradReducer)
    assert (red.ratio, red.error_feedback, red.warmup_reduces) == (0.001, True, 3 * GAS)
    for stage in (0, 1):
        with pytest.raises(ZeroliteConfigError, match=r"zerolite\.sparse_gradients: needs "
                           r"zero_optimization\.stage 2 or 3"):
            load_config(_sparse_cfg(2, 0.01, stage=stage), 2)
    cfg = _sparse_cfg(2, 0.01)
    cfg["zero_optimization"]["zero_quantized_gradients"] = True
    with pytest.raises(ZeroliteConfigError, match="zero_quantized_gradients"):
        load_config(cfg, 2)
    for key, bad in [("ratio", 0), ("ratio", 1.5), ("ratio", "1%"), ("error_feedback", 1),
                     ("warmup_steps", -1), ("warmup_steps", 0.5)]:
        cfg = ds_config(2)
        cfg["zerolite"] = {"sparse_gradients": {key: bad}}
        with pytest.raises(ZeroliteConfigError, match=rf"zerolite\.sparse_gradients\.{key}"):
            load_config(cfg, 2)
    cfg["zerolite"] = {"sparse_gradients": 0.01}
    with pytest.raises(ZeroliteConfigError, match=r"zerolite\.sparse_gradients"):
        load_config(cfg, 2)
    defaults = load_config(dict(ds_config(2), zerolite={"sparse_gradients": {}}), 2)
    assert defaults.zerolite.sparse_gradients.ratio == 0.01
    assert type(build_grad_reducer(load_config(ds_config(2), 2), 2)) is GradReducer


def test_check_config_counts_the_residual(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_sparse_cfg(2, 0.01)))
    assert check_config_main([str(path), "--world-size", "2", "--params", "1000000"]) == 0
    out = capsys.readouterr().out
    assert "sparse_gradients error-feedback residual" in out and "3.815 MiB per rank" in out
    path.write_text(json.dumps(_sparse_cfg(2, 0.01, ef=False)))
    assert check_config_main([str(path), "--world-size", "2", "--params", "1000000"]) == 0
    assert "residual" not in capsys.readouterr().out


def _ratio_one(rank, world, sparse):
    cfg = _sparse_cfg(world, 1.0) if sparse else ds_config(world)
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    return train_engine(engine, batches(STEPS), rank, world)


def test_ratio_one_is_the_dense_reduce():
    """Selecting every entry sends the whole gradient: the training is the dense one."""
    sparse = run_ranks(_ratio_one, 2, True)[0]
    dense = run_ranks(_ratio_one, 2, False)[0]
    torch.testing.assert_close(torch.tensor(sparse), torch.tensor(dense), rtol=1e-6, atol=0)
