"""Gradient precision under bf16 ([Note: gradient precision] in zerolite/zero/flat_param.py):
at world 2 with accumulation 4, every stage trains the tiny GPT exactly as the plain-torch
bf16 + fp32-masters reference that combines the gradients with DeepSpeed's arithmetic for
that stage (zerolite/testing/bf16_reference.py), by default (everything in bf16), with
`data_types.grad_accum_dtype` / `communication_data_type` "fp32", and with the optimizer
offloaded (the host adds the micro-steps' shards). tests/test_ds_conformance.py
holds the same arithmetic to DeepSpeed itself (program gradient_precision).

Note: the tolerance is fp32-tight, as in test_bf16_reference.py: one bf16 rounding more or
less moves some weight by a bf16 ulp (~4e-3 relative) within a few steps. Each case also
checks that the reference with fp32 sums is far off, so the case can tell them apart.
"""
import pytest
import torch

import zerolite
from zerolite.config import TORCH_DTYPES, load_config
from zerolite.errors import ZeroliteConfigError
from zerolite.testing.bf16_reference import (combine_gradients, piece_gradients,
                                              train_bf16_master_reference)
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, adamw, batches, ds_config, tiny_gpt
from test_bf16_reference import one_thread

WORLD, GAS, STEPS = 2, 4, 4

CASES = {
    "stage0": (0, {}), "stage1": (1, {}), "stage2": (2, {}), "stage3": (3, {}),
    "stage1_fp32_accumulation": (1, {"data_types": {"grad_accum_dtype": "fp32"}}),
    "stage3_fp32_accumulation": (3, {"data_types": {"grad_accum_dtype": "fp32"}}),
    "stage2_fp32_communication": (2, {"communication_data_type": "fp32"}),
    "stage2_offload_optimizer": (2, {"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}}),
}


def _rank(rank, world, stage, extra):
    model = tiny_gpt()
    cfg = ds_config(world, stage=stage, bf16=True, gas=GAS, **extra)
    cfg["optimizer"]["params"]["torch_adam"] = True  # the reference's kernel
    # separate_host: with offload the host copies are real on CPU too (test_offload_cpu.py)
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                     separate_host=True)
    losses = train_engine(engine, batches(STEPS), rank, world)
    return losses, gather_full_state_dict(engine.sharded)


def _reference(stage, extra, fp32_sums=False):
    names = {"comm_dtype": extra.get("communication_data_type"),
             "accum_dtype": extra.get("data_types", {}).get("grad_accum_dtype")}
    dtypes = {k: torch.float32 if fp32_sums else (TORCH_DTYPES[v] if v else None)
              for k, v in names.items()}
    with one_thread():
        return train_bf16_master_reference(tiny_gpt(), batches(STEPS), lambda m, x, y: m(x, y),
                                           adamw, clip=CLIP, world=WORLD, gas=GAS, stage=stage,
                                           **dtypes)


def _largest_gap(params, ref_params) -> float:
    return max(float(((params[n] - v).abs() / v.abs().clamp_min(1e-3)).max())
               for n, v in ref_params.items())


@pytest.mark.parametrize("case", list(CASES))
def test_each_stage_sums_gradients_as_deepspeed(case):
    stage, extra = CASES[case]
    losses, params = run_ranks(_rank, WORLD, stage, extra)[0]
    ref_losses, ref_params = _reference(stage, extra)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-6, atol=0)
    assert params.keys() == ref_params.keys()
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"{name}: {m}")
    # every case keeps bf16 somewhere on the path: the fp32-sum reference is visibly elsewhere
    assert _largest_gap(params, _reference(stage, extra, fp32_sums=True)[1]) > 1e-3


@pytest.mark.parametrize("accum", ["fp32", "fp16"])
def test_stage0_keeps_the_training_dtype(accum):
    """DeepSpeed refuses another accumulation dtype at stage 0 (its engine sums p.grad)."""
    cfg = ds_config(1, stage=0, bf16=True, data_types={"grad_accum_dtype": accum})
    with pytest.raises(ZeroliteConfigError, match=r"data_types\.grad_accum_dtype.*stage 0"):
        load_config(cfg, 1)
    cfg["data_types"]["grad_accum_dtype"] = "bf16"  # the training dtype itself is fine
    assert load_config(cfg, 1).grad_accum_torch_dtype is torch.bfloat16
    cfg["zero_optimization"]["stage"] = 1  # stages 1-3 take any
    cfg["data_types"]["grad_accum_dtype"] = accum
    assert load_config(cfg, 1).grad_accum_torch_dtype is TORCH_DTYPES[accum]


def test_both_dtypes_default_to_the_training_dtype():
    for mode, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), (None, torch.float32)):
        cfg = ds_config(1)
        if mode:
            cfg[mode] = {"enabled": True}
        config = load_config(cfg, 1)
        assert config.grad_accum_torch_dtype is dtype and config.communication_torch_dtype is dtype


def _param_grads(rank, world, stage):
    """p.grad after every backward of two steps (accumulation 2, bf16), then the weights."""
    model = tiny_gpt()
    cfg = ds_config(world, stage=stage, bf16=True, gas=2)
    cfg["optimizer"]["params"]["torch_adam"] = True
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    seen = []
    for batch in batches(2):
        for x, y in rank_micro_batches(batch, rank, world, 2):
            engine.backward(engine(x, y))
            seen.append({n: None if p.grad is None else p.grad.clone()
                         for n, p in engine.module.named_parameters()})
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            if boundary:  # the step took them
                assert all(p.grad is None for p in engine.module.parameters())
    return seen


def _bf16_piece_grads(batch, world, gas):
    """Plain torch: each (rank, micro-step) piece's bf16 gradient of loss / gas, by name."""
    work = tiny_gpt().to(torch.bfloat16)
    names = [n for n, _ in work.named_parameters()]  # the distinct parameters, in order
    _, grads = piece_gradients(work, batch, lambda m, x, y: m(x, y), world=world, gas=gas)
    return [dict(zip(names, g)) for g in grads]


@pytest.mark.parametrize("stage", [0, 1])
def test_param_grad_after_backward_in_bf16(stage):
    """Stage 0: this rank's bf16 sum after the first micro-step, the bf16 average after the
    boundary's backward (DeepSpeed's p.grad); stage 1: the local sum, then None. Checked
    against plain torch on the first step (before any update)."""
    seen = [run_ranks(_param_grads, WORLD, stage)[r] for r in range(WORLD)]
    pieces = _bf16_piece_grads(batches(2)[0], WORLD, 2)
    for rank in range(WORLD):
        first, boundary = seen[rank][0], seen[rank][1]
        for name, got in first.items():
            assert got is not None and got.dtype == torch.bfloat16, name
            assert torch.equal(got, pieces[rank * 2][name]), name
        for name, got in boundary.items():
            if stage == 1:
                assert got is None, name
                continue
            want = combine_gradients([p[name] for p in pieces], world=WORLD, gas=2, stage=0,
                                     comm_dtype=torch.bfloat16, accum_dtype=torch.bfloat16)
            assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want), name
