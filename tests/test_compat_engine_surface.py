"""The DeepSpeedEngine surface DeepSpeed programs read (zerolite/engine_accessors.py), at
world 2, checked against what the engine actually does and a single-process reference."""
import copy

import pytest
import torch

import zerolite
from zerolite.compat.deepspeed import DeepSpeedEngine
from zerolite.errors import ZeroliteConfigError
from zerolite.testing.multiprocess import run_ranks
from zerolite.optim.grad_norm import clip_grads_
from zerolite.testing.reference import rank_micro_batches

from gpt_cases import CLIP, adamw, batches, ds_config, tiny_gpt


def _surface(rank, world, stage):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=stage))
    cfg = engine.config
    try:
        engine.not_an_engine_attribute
        missing = None
    except AttributeError as e:
        missing = str(e)
    return {
        "missing": missing,
        "isinstance": isinstance(engine, DeepSpeedEngine),
        "local_rank": engine.local_rank, "global_rank": engine.global_rank,
        "dp_world_size": engine.dp_world_size, "device": str(engine.device),
        "zero_optimization": engine.zero_optimization(),
        "partition_gradients": engine.zero_optimization_partition_gradients(),
        "partition_weights": engine.zero_optimization_partition_weights(),
        "config_stage": cfg.get("zero_optimization", {}).get("stage"),
        "config_attr_stage": cfg.zero_optimization.stage,
        "batch_info": engine.get_batch_info(),
        # DeepSpeed's stage 3 module.state_dict(): partitioned params are empty tensors
        "empty_state": sorted({v.numel() for v in model.state_dict().values()}),
    }


@pytest.mark.parametrize("stage", [1, 3])
def test_engine_reports_who_where_and_what(stage):
    results = run_ranks(_surface, 2, stage)
    for rank, r in enumerate(results):
        assert r["isinstance"] and r["local_rank"] == rank and r["global_rank"] == rank
        assert r["dp_world_size"] == 2 and r["device"] == "cpu"
        assert r["zero_optimization"] is True
        assert r["partition_gradients"] is (stage >= 2)
        assert r["partition_weights"] is (stage == 3)
        assert r["config_stage"] == r["config_attr_stage"] == stage
        assert r["batch_info"] == (8, 2, 2)  # train batch 8 = micro 2 x gas 2 x world 2
        assert (r["empty_state"] == [0]) is (stage == 3)
        assert r["missing"].startswith("'not_an_engine_attribute': neither zerolite's engine nor "
                                       "the wrapped GPT has this attribute"), r["missing"]


def _train_then_call_module(rank, world):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    norms = []
    for batch in batches(4):
        for x, y in rank_micro_batches(batch, rank, world, engine.gradient_accumulation_steps()):
            engine.backward(engine(x, y))
            engine.step()
        norms.append(float(engine.get_global_grad_norm()))
    engine.eval()
    x, y = batches(5)[-1]
    with torch.no_grad():
        out = engine.module(x, y).item()  # the raw module, as DeepSpeed's CIFAR example does
    return out, norms


def _reference_norms_and_final_loss():
    """Plain PyTorch on the global batch: pre-clip float64 grad norm per step, then the
    trained model's loss on a held-out batch."""
    model = copy.deepcopy(tiny_gpt())
    opt = adamw(model.parameters())
    norms = []
    for x, y in batches(4):
        model(x, y).backward()
        grads = [p.grad for p in model.parameters()]
        norms.append(float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.double()) for g in grads]))))
        clip_grads_(grads, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    x, y = batches(5)[-1]
    with torch.no_grad():
        return norms, model(x, y).item()


def test_module_called_directly_after_training_and_grad_norm_match_reference():
    ref_norms, ref_out = _reference_norms_and_final_loss()
    out, norms = run_ranks(_train_then_call_module, 2)[0]
    assert out == pytest.approx(ref_out, rel=1e-5)
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), rtol=1e-5, atol=0)


def _batch_size_changes(rank, world):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=2, gas=1,
                                                                   train_batch_size=4))
    errors = []
    for bad in (6, 0, "8"):
        try:
            engine.set_train_batch_size(bad)
        except ZeroliteConfigError as e:
            errors.append(str(e))
    engine.set_train_batch_size(12)  # micro 2 x world 2 x gas 3
    boundaries = []
    x, y = batches(1)[0]
    for _ in range(6):
        boundaries.append(engine.is_gradient_accumulation_boundary())
        engine.backward(engine(x[:2], y[:2]))
        engine.step()
    return errors, engine.gradient_accumulation_steps(), engine.train_batch_size(), \
        boundaries, engine.global_steps


def test_set_train_batch_size_changes_accumulation():
    errors, gas, tbs, boundaries, steps = run_ranks(_batch_size_changes, 2)[0]
    assert len(errors) == 3 and all("multiple of" in e and "= 4" in e for e in errors), errors
    assert (gas, tbs, steps) == (3, 12, 2)
    assert boundaries == [False, False, True, False, False, True]


# -- the engine is an nn.Module; its optimizer's step is the whole update --------------------
def _module_surface(rank, world):
    model = tiny_gpt()
    engine, optimizer, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    seen = []
    handle = engine.register_forward_pre_hook(lambda mod, args: seen.append(mod is engine))
    x = batches(1)[0][0][:2]
    engine(x)
    handle.remove()
    names = [n for n, _ in engine.named_parameters()]
    return {"is_module": isinstance(engine, torch.nn.Module),
            "modules": [type(m).__name__ for m in list(engine.modules())[:2]],
            "same_params": [id(p) for p in engine.parameters()] == [id(p) for p in
                                                                   model.parameters()],
            "prefixed": all(n.startswith("module.") for n in names) and len(names) > 0,
            "hook_ran": seen == [True], "passthrough": engine.cfg is model.cfg,
            "optimizer": [type(optimizer).__name__, optimizer.optimizer is
                          engine.basic_optimizer, optimizer.param_groups is
                          engine.basic_optimizer.param_groups]}


def test_engine_is_an_nn_module_as_deepspeeds():
    out = run_ranks(_module_surface, 2)[0]
    assert out == {"is_module": True, "modules": ["ZeroEngine", "GPT"], "same_params": True,
                   "prefixed": True, "hook_ran": True, "passthrough": True,
                   "optimizer": ["ZeroOptimizer", True, True]}


def _stepped(rank, world, stage, direct):
    """`direct`: step the optimizer initialize returned, as Lightning Fabric does."""
    model = tiny_gpt()
    engine, optimizer, *_ = zerolite.initialize(
        model=model, config=ds_config(world, stage=stage, bf16=True, gas=1))
    for batch in batches(3):
        (xb, yb), = rank_micro_batches(batch, rank, world, gas=1)
        loss = engine(xb, yb)
        engine.backward(loss)
        if direct:
            optimizer.step()
            optimizer.zero_grad()
        else:
            engine.step()
    from zerolite.zero.sharded_model import gather_full_state_dict

    return gather_full_state_dict(engine.sharded), engine.get_global_grad_norm()


@pytest.mark.parametrize("stage", [1, 3])
def test_stepping_the_returned_optimizer_is_the_whole_update(stage):
    """Clipping, the bf16 copy back into the parameters: what engine.step() updates, a direct
    optimizer.step() updates the same (DeepSpeed's ZeRO optimizer.step does the update)."""
    via_engine, norm = run_ranks(_stepped, 2, stage, False)[0]
    direct, direct_norm = run_ranks(_stepped, 2, stage, True)[0]
    assert norm == direct_norm and norm > CLIP  # clipping was active
    for key, value in via_engine.items():
        assert torch.equal(direct[key], value), key
