"""A gradient with inf or NaN: which configurations skip the optimizer step, as DeepSpeed 0.19
does (engine.py, [Note: non-finite gradients]; DeepSpeed itself is compared in
test_ds_conformance.py, scenario nonfinite_gradient)."""
import pytest
import torch

import zerolite
from zerolite.config import load_config
from zerolite.engine import skips_nonfinite_steps
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import batches, ds_config, tiny_gpt


@pytest.mark.parametrize("stage, precision, extra, skips", [
    (0, "fp32", {}, False), (0, "bf16", {}, True), (0, "fp16", {}, True),
    (1, "fp32", {}, True), (2, "fp32", {}, True), (3, "fp32", {}, True),
    (1, "bf16", {}, True), (2, "bf16", {}, True), (3, "bf16", {}, True),
    (1, "bf16", {"check": False}, False), (2, "bf16", {"check": False}, False),
    (3, "bf16", {"check": False}, True),
    (1, "bf16", {"check": False, "fp32_accumulation": True}, True),
    (1, "bf16", {"check": False, "fp32_accumulation": True, "offload": True}, False),
])
def test_which_configurations_skip(stage, precision, extra, skips):
    cfg = {"train_batch_size": 4, "zero_optimization": {"stage": stage}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    if "check" in extra:
        cfg["bf16"]["check_grad_overflow"] = extra["check"]
    if extra.get("fp32_accumulation"):
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if extra.get("offload"):
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    assert skips_nonfinite_steps(load_config(cfg, 1)) is skips


def _nan_in_step(rank, world, stage, poison):
    model = tiny_gpt()
    cfg = ds_config(world, stage=stage, gas=1, scheduler={
        "type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                                       "warmup_num_steps": 4, "warmup_type": "linear"}})
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    if poison:  # the embedding returns NaN in step 2: every gradient of that step is NaN
        calls = [0]

        def nan_once(module, args, output):
            calls[0] += 1
            return output * float("nan") if calls[0] == 2 else output

        model.tok_emb.register_forward_hook(nan_once)
    data = batches(4)
    seen = []
    for i, batch in enumerate(data):
        if not poison and i == 1:
            continue  # the reference: the same run without that step
        train_engine(engine, [batch], rank, world)
        seen.append((engine.was_step_applied(), engine.skipped_steps, engine.get_lr()[0],
                     float(engine.get_global_grad_norm())))
    return seen, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_nan_step_is_skipped_and_training_goes_on(stage):
    """World 2: the NaN step changes nothing (parameters, optimizer state, lr schedule) but
    the counters, so the run ends where a run without that step ends."""
    seen, params = run_ranks(_nan_in_step, 2, stage, True)[0]
    ref_seen, ref_params = run_ranks(_nan_in_step, 2, stage, False)[0]
    applied = [s[0] for s in seen]
    assert applied == [True, False, True, True]
    assert [s[1] for s in seen] == [0, 1, 1, 1]
    assert seen[1][3] == float("inf")
    assert [s[2] for s in seen[2:]] == [s[2] for s in ref_seen[1:]]  # the lr did not advance
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=0,
                                   msg=lambda m: f"{name}: {m}")
