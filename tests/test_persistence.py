"""stage3_param_persistence_threshold per parameter, as DeepSpeed applies it: which parameters
persist, that training with them equals plain PyTorch, and when they are gathered (residency.py,
[Note: persistent parameters]; DeepSpeed's own statuses are compared in test_ds_conformance.py,
scenario param_persistence)."""
import sys

import pytest
import torch
import torch.nn.functional as F

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine
from zerolite.zero import GatheredParameters
from zerolite.zero.partition import persistent_params
from zerolite.zero.param_status import ZeroParamStatus
from zerolite.zero.sharded_model import gather_full_state_dict
from zerolite.zero.unit import UnitState

from gpt_cases import batches, ds_config, reference_run, tiny_gpt

PERSIST = 1024
"""Persists: the norms, the biases, the position table and attn.proj.weight (exactly 1024
elements: "at most" includes it); not: the token table, qkv, fc and out weights."""


def _config(world, **zero):
    cfg = ds_config(world, stage=3)
    cfg["zero_optimization"].update({"stage3_param_persistence_threshold": PERSIST, **zero})
    return cfg


def _names(model, params):
    return {n for n, p in model.named_parameters() if p in params}


def test_which_parameters_persist():
    model = tiny_gpt()
    small = {n for n, p in model.named_parameters() if p.numel() <= PERSIST}
    assert "blocks.0.attn.proj.weight" in small and "tok_emb.weight" not in small
    assert _names(model, persistent_params(model, PERSIST, sys.maxsize)) == small
    # A model budget takes them in model order and skips one that would exceed it (later,
    # smaller ones may still fit): 512 + 32 + 32, then qkv.bias (96) would pass 600.
    assert _names(model, persistent_params(model, PERSIST, 600)) == {
        "pos_emb.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias"}
    assert persistent_params(model, 0, sys.maxsize) == set()


def _units(rank, world, zero):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=_config(world, **zero))
    persist = {n for n, p in model.named_parameters() if p.ds_persist}
    listed = {id(p) for p in engine.optimizer.parameter_offload.persistent_parameters}
    return ([u.name for u in engine.sharded.units], persist,
            [n for n, p in model.named_parameters() if id(p) in listed])


def test_persistent_parameters_leave_their_units():
    names, persist, listed = run_ranks(_units, 1, {})[0]
    assert names == ["<root>", "blocks.0", "blocks.1", "<persistent>"]
    model = tiny_gpt()
    assert persist == {n for n, p in model.named_parameters() if p.numel() <= PERSIST}
    assert sorted(listed) == sorted(persist)
    # The default threshold (1e5) takes every parameter of this model: the blocks have none
    # left and are no units any more.
    names, persist, _ = run_ranks(_units, 1, {"stage3_param_persistence_threshold": 100_000})[0]
    assert names == ["<root>", "<persistent>"] and len(persist) == 28


def _train(rank, world, threshold, zero_init):
    cfg = _config(world, stage3_param_persistence_threshold=threshold)
    if zero_init:
        with zerolite.zero.Init(config_dict_or_path=cfg):
            model = tiny_gpt()
    else:
        model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    losses = train_engine(engine, batches(), rank, world)
    return losses, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("threshold, zero_init", [(PERSIST, False), (100_000, False),
                                                  (PERSIST, True)])
def test_training_with_persistent_parameters_matches_reference(threshold, zero_init):
    """World 2, AdamW, clipping, accumulation 2, 20 steps, fp32: some parameters persistent,
    all of them, and a zero.Init model (its parameters' full sizes decide)."""
    ref_losses, ref_params = reference_run()
    losses, params = run_ranks(_train, 2, threshold, zero_init)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")


def _statuses(model):
    out = {}
    for n, p in model.named_parameters():
        available = p.ds_status is ZeroParamStatus.AVAILABLE
        assert p.numel() == (p.ds_numel if available else 0), n
        out[n] = available
    return out


def _lifecycle(rank, world, tmp):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=_config(world))
    persist = {n for n, p in model.named_parameters() if p.ds_persist}
    unit = engine.sharded.residency.persistent_unit
    seen = {"init": _statuses(model)}
    states = []
    for block in model.blocks:  # the persistent unit's state while each block runs
        block.register_forward_pre_hook(lambda m, a: states.append(unit.state))
    data = batches(3)
    train_engine(engine, data[:1], rank, world)
    seen["first_step"] = _statuses(model)
    train_engine(engine, data[1:2], rank, world)
    seen["second_step"] = _statuses(model)
    full = gather_full_state_dict(engine.sharded)
    values_match = all(torch.equal(p.detach(), full[n]) for n, p in model.named_parameters()
                       if n in persist)
    engine.empty_partition_cache()
    seen["emptied"] = _statuses(model)
    x = torch.randn(4, 32)
    direct = model.ln_f(x)  # a module holding persistent parameters, called on its own
    expect = F.layer_norm(x, (32,), full["ln_f.weight"], full["ln_f.bias"])
    seen["direct_call"] = _statuses(model)
    engine.empty_partition_cache()
    with torch.no_grad():  # and one holding a block's weight and a persistent bias
        mixed = model.blocks[0].fc(x)
    direct_ok = torch.equal(direct, expect) and torch.allclose(
        mixed, F.linear(x, full["blocks.0.fc.weight"], full["blocks.0.fc.bias"]))
    seen["mixed_call"] = _statuses(model)
    with GatheredParameters([model.ln_f.weight]):
        inside = model.ln_f.weight.numel()
    seen["after_gathered"] = _statuses(model)
    engine.save_checkpoint(tmp, tag="t")
    seen["saved"] = _statuses(model)
    engine.empty_partition_cache()
    engine.load_checkpoint(tmp, tag="t")
    seen["loaded"] = _statuses(model)
    x, y = next(iter(rank_micro_batches(data[2], rank, world, 2)))
    engine.backward(engine(x, y))
    seen["backward"] = _statuses(model)  # where the HF Trainer counts p.numel() for its flos
    engine.step()
    seen["third_step"] = _statuses(model)
    return persist, seen, states, values_match, direct_ok, inside


def test_persistent_parameters_stay_gathered_between_steps(tmp_path):
    persist, seen, states, values_match, direct_ok, inside = run_ranks(
        _lifecycle, 2, str(tmp_path))[0]
    everything = set(seen["init"])
    kept = {n: n in persist for n in everything}
    none = {n: False for n in everything}
    assert seen["init"] == none  # gathered at their first use, not by initialize
    # After a step: the persistent ones gathered (after the first too: gathered again after
    # the optimizer step), every other one released.
    for when in ("first_step", "second_step", "saved", "loaded", "backward", "third_step"):
        assert seen[when] == kept, when
    assert values_match  # they hold the parameters' current values
    # No block waits for them: gathered (with the root) whenever a block runs.
    assert set(states) == {UnitState.GATHERED}
    assert seen["emptied"] == none  # empty_partition_cache releases them too
    assert direct_ok and seen["direct_call"] == kept  # gathered again for a direct call
    assert seen["mixed_call"] == kept
    # A GatheredParameters listing one releases it (all of them) on exit, as DeepSpeed
    # partitions every parameter listed.
    assert inside == 32 and seen["after_gathered"] == none
