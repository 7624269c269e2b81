"""DeepSpeed's torch_autocast mode (zerolite/autocast.py, [Note: torch_autocast]) against a
single-process PyTorch reference that does on purpose what the mode says: the forward under
torch.autocast, each rank's gradients of Linear parameters averaged in the autocast dtype
(rounded, summed over ranks, rounded again), the rest in fp32, fp16 with a loss scale of
2**16; at stage 3 the forward sees Linear weights rounded to that dtype (the GPT's embedding
is tied to its Linear head, so its lookups see them too). DeepSpeed itself is compared in test_ds_conformance.py (torch_autocast_mode,
outer_autocast)."""
import copy

import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.autocast import TorchAutocast, default_safe_module_names
from zerolite.config import load_config
from zerolite.errors import ZeroliteConfigError
from zerolite.optim.grad_norm import clip_coefficient, global_grad_norm
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, GAS, LR, WD, batches, ds_config, tiny_gpt

WORLD, STEPS = 2, 4


def _reference(stage, dtype, round_safe=True):
    """World-2 training in one process, reducing as DeepSpeed's torch_autocast does."""
    model = tiny_gpt()
    safe = {id(p) for m in model.modules() if type(m) is nn.Linear for p in m.parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    scale = 2.0 ** 16 if dtype == torch.float16 else 1.0
    losses = []
    for batch in batches(STEPS):
        reduced = {p: torch.zeros_like(p) for p in model.parameters()}
        local = [{p: torch.zeros_like(p) for p in model.parameters()} for _ in range(WORLD)]
        total = 0.0
        for micro in range(GAS):
            for rank in range(WORLD):
                x, y = rank_micro_batches(batch, rank, WORLD, GAS)[micro]
                exact = {p: p.data for p in model.parameters() if id(p) in safe}
                if stage == 3 and round_safe:  # fetched in the autocast dtype
                    for p in exact:
                        p.data = p.data.to(dtype).float()
                with torch.autocast("cpu", dtype=dtype):
                    loss = model(x, y)
                (loss / GAS * scale).backward()
                for p, value in exact.items():
                    p.data = value
                total += loss.item()
                for p in model.parameters():
                    local[rank][p] += p.grad
                    p.grad = None
            if stage >= 2:  # reduced every micro-step
                _reduce_into(reduced, local, stage, safe, dtype, round_safe)
                local = [{p: torch.zeros_like(p) for p in model.parameters()}
                         for _ in range(WORLD)]
        if stage < 2:  # reduced once, at the boundary
            _reduce_into(reduced, local, stage, safe, dtype, round_safe)
        grads = list(reduced.values())
        if stage == 0:
            for g in grads:
                g.mul_(1.0 / scale)
        norm = global_grad_norm(grads, distributed=False)
        coef = clip_coefficient(norm, CLIP)
        for p, g in reduced.items():
            p.grad = g * coef if coef is not None else g
            if stage > 0:
                p.grad.mul_(1.0 / scale)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / (WORLD * GAS))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _reduce_into(reduced, local, stage, safe, dtype, round_safe):
    for p in reduced:
        if stage > 0 and round_safe and id(p) in safe:
            parts = [(loc[p] / WORLD).to(dtype).float() for loc in local]
            reduced[p] += sum(parts).to(dtype).float()
        elif stage > 0:
            reduced[p] += sum(loc[p] / WORLD for loc in local)
        else:
            reduced[p] += sum(loc[p] for loc in local) / WORLD


def _train(rank, world, stage, dtype_name):
    model = tiny_gpt()
    cfg = ds_config(world, stage=stage, torch_autocast={"enabled": True, "dtype": dtype_name})
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    losses = train_engine(engine, batches(STEPS), rank, world)
    comm = sorted({str(f.comm_dtype) for f in engine.sharded.flats})
    return losses, gather_full_state_dict(engine.sharded), comm, engine.skipped_steps


@pytest.mark.parametrize("stage, dtype_name", [(0, "bf16"), (1, "bf16"), (2, "bf16"),
                                               (3, "bf16"), (0, "fp16"), (2, "fp16")])
def test_matches_the_reference(stage, dtype_name):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    losses, params, comm, skipped = run_ranks(_train, WORLD, stage, dtype_name)[0]
    ref_losses, ref_params = _reference(stage, dtype)
    assert skipped == 0
    assert comm == (["None"] if stage == 0 else sorted([str(dtype), "torch.float32"]))
    torch.testing.assert_close(losses, ref_losses, rtol=1e-6, atol=0)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=1e-7,
                                   msg=lambda m: f"{name}: {m}")
    if stage > 0:  # the rounding is what makes it match: without it the run differs more
        _, unrounded = _reference(stage, dtype, round_safe=False)
        gap = max((params[n] - ref_params[n]).abs().max().item() for n in ref_params)
        off = max((params[n] - unrounded[n]).abs().max().item() for n in unrounded)
        assert off > max(1e-6, 20 * gap), (off, gap)


def test_forward_context():
    """The engine's forward runs under its own autocast setting; a program's autocast is
    turned off inside when the CUDA flag is set, left alone when only the CPU one is."""
    on = load_config({"train_batch_size": 1, "torch_autocast": {"enabled": True,
                                                                 "dtype": "fp16"}}, 1)
    off = load_config({"train_batch_size": 1}, 1)
    cpu = torch.device("cpu")
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    with TorchAutocast(on.torch_autocast, cpu).forward_context():
        assert (a @ b).dtype == torch.float16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with TorchAutocast(off.torch_autocast, cpu).forward_context():
            assert (a @ b).dtype == torch.bfloat16
        torch.set_autocast_enabled("cuda", True)
        try:
            with TorchAutocast(off.torch_autocast, cpu).forward_context():
                assert (a @ b).dtype == torch.float32
            with TorchAutocast(on.torch_autocast, cpu).forward_context():
                assert (a @ b).dtype == torch.float16
        finally:
            torch.set_autocast_enabled("cuda", False)


def test_comm_dtypes_and_config_errors():
    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2), nn.Conv1d(1, 1, 1))
    cfg = load_config({"train_batch_size": 1, "torch_autocast": {"enabled": True,
                                                                  "dtype": "bfloat16"}}, 1)
    ac = TorchAutocast(cfg.torch_autocast, torch.device("cpu"))
    dtypes = ac.comm_dtypes(copy.deepcopy(model), stage=2)
    assert [str(d) for d in dtypes.values()] == ["torch.bfloat16"] * 2 + ["torch.float32"] * 2 \
        + ["torch.bfloat16"] * 2
    assert ac.comm_dtypes(model, stage=0) == {}
    assert model[0].weight.comm_dtype == torch.bfloat16  # DeepSpeed's attribute
    assert not hasattr(model[1].weight, "comm_dtype")
    assert default_safe_module_names()[0] == "torch.nn.modules.linear.Linear"
    with pytest.raises(ZeroliteConfigError, match=r"lower_precision_safe_modules\[1\]"):
        bad = load_config({"train_batch_size": 1, "torch_autocast": {
            "enabled": True, "lower_precision_safe_modules": ["torch.nn.Linear", "torch.nn.Nope"]}},
            1)
        TorchAutocast(bad.torch_autocast, torch.device("cpu"))
    with pytest.raises(ZeroliteConfigError, match="torch_autocast.enabled"):
        load_config({"train_batch_size": 1, "fp16": {"enabled": True},
                     "torch_autocast": {"enabled": True}}, 1)
    with pytest.raises(ZeroliteConfigError, match="zero_quantized_weights"):
        load_config({"train_batch_size": 1, "torch_autocast": {"enabled": True},
                     "zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, 1)
    with pytest.raises(ZeroliteConfigError, match="torch_autocast.dtype"):
        load_config({"train_batch_size": 1, "torch_autocast": {"enabled": True,
                                                               "dtype": "int7"}}, 1)


def _accessors(rank, world):
    model = tiny_gpt()
    cfg = ds_config(world, stage=2, torch_autocast={"enabled": True, "dtype": "fp16"})
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    x, y = rank_micro_batches(batches(1)[0], rank, world, GAS)[0]
    out = engine(x)
    return (engine.torch_autocast_enabled(), engine.torch_autocast_dtype(),
            engine.torch_autocast_lower_precision_safe_modules(), out.dtype,
            engine.amp_scaler.loss_scale, str(engine.scale(engine(x, y)).dtype))


def test_engine_accessors():
    enabled, dtype, modules, out_dtype, scale, scaled = run_ranks(_accessors, 1)[0]
    assert (enabled, dtype, modules) == (True, torch.float16, default_safe_module_names())
    assert out_dtype == torch.float16  # the forward ran under autocast (lm_head is Linear)
    assert scale == 2.0 ** 16 and scaled == "torch.float32"


def _on_cuda(rank, world):
    dtypes = {}
    for name, extra in (("off", {}), ("bf16", {"torch_autocast": {"enabled": True,
                                                                    "dtype": "bf16"}})):
        model = tiny_gpt()
        engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                         config=ds_config(world, stage=3, **extra))
        x, _ = rank_micro_batches(batches(1)[0], rank, world, GAS)[0]
        with torch.autocast("cuda", dtype=torch.float16):  # the program's own autocast
            dtypes[name] = engine(x.to(engine.device)).dtype
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=ds_config(world, stage=3, torch_autocast={
                                         "enabled": True, "dtype": "fp16"}))
    losses = train_engine(engine, batches(STEPS), rank, world)
    return dtypes, losses, engine.skipped_steps


@pytest.mark.cuda
def test_on_cuda_the_programs_autocast_gives_way():
    """CUDA, world 1: a program's torch.autocast("cuda") around the engine's call is off
    inside the forward without torch_autocast and replaced by it with; fp16 trains."""
    dtypes, losses, skipped = run_ranks(_on_cuda, 1, timeout_s=600)[0]
    assert dtypes == {"off": torch.float32, "bf16": torch.bfloat16}
    assert skipped == 0 and losses[-1] < losses[0]
