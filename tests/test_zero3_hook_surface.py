"""DeepSpeed's ZeRO-3 parameter surface as TRL uses it (trl/models/utils.py, trl/trainer/utils.py):
`param.ds_status` / ZeroParamStatus, `engine.optimizer.parameter_offload` with its hook lists,
`param.ds_active_sub_modules`, the coordinator's trace calls and `_register_deepspeed_module`,
and a custom autograd Function that saves a parameter and reads its `ds_status` in backward
(TRL's chunked loss), and modules called on their own, outside their unit's forward (DeepSpeed
gathers module by module, so `model.get_input_embeddings()(ids)` works there). World 2, gloo;
losses against a plain single-process run."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerolite
from zerolite.errors import ZeroliteConfigError, ZeroliteStateError
from zerolite.models import GPT, GPTConfig
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero import GatheredParameters, Init
from zerolite.zero.param_status import ZeroParamStatus, ZeroParamType
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, adamw, batches, ds_config, reference_run, tiny_gpt

HOOKS = (6 + 2 * 16, 6)
AVAILABLE, NOT_AVAILABLE, INFLIGHT = (ZeroParamStatus.AVAILABLE, ZeroParamStatus.NOT_AVAILABLE,
                                      ZeroParamStatus.INFLIGHT)


def _statuses(params):
    return sorted({p.ds_status.name for p in params})


def _generate_like_trl(engine, x):
    """TRL's _unwrap_model_for_generation + remove_hooks / add_hooks, step by step; returns
    what it saw."""
    # TRL's choice: the ZeRO-3 optimizer's parameter_offload, or the engine's optimizer itself
    # when the engine has none (DeepSpeed then returns its DeepSpeedZeRoOffload).
    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    coordinator = offload.param_coordinator
    model = offload.module
    seen = {}
    with GatheredParameters(engine.parameters()):
        gathers = engine.sharded.stats.current.gathers
        seen["inside"] = _statuses(model.parameters())
        seen["external"] = list(model.ds_external_parameters())
        for p in model.parameters():
            p.ds_active_sub_modules.clear()
        for hook in offload.forward_hooks:
            hook.remove()
        for hook in offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        seen["module_hooks_left"] = sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                                        for m in model.modules())
        with torch.no_grad():
            seen["logits"] = model(x)
        seen["gathers_while_unhooked"] = engine.sharded.stats.current.gathers - gathers
        if not coordinator.is_invalid_trace():
            coordinator._invalidate_trace()
        seen["invalid_after_invalidate"] = coordinator.is_invalid_trace()
        offload._register_deepspeed_module(offload.module)
    seen["after"] = _statuses(model.parameters())
    seen["numel_after"] = sum(p.numel() for p in model.parameters())
    seen["hooks_after"] = (len(offload.forward_hooks), len(offload.backward_hooks))
    return seen


def _trl_generation_round_trip(rank, world):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    offload = engine.optimizer.parameter_offload
    coordinator = offload.param_coordinator
    out = {"offload_module_is_model": offload.module is model,
           "invalid_at_start": coordinator.is_invalid_trace(),
           "hooks": (len(offload.forward_hooks), len(offload.backward_hooks))}
    probe = {}

    def look(module, args):  # runs after zerolite's pre-hook: block 0 is gathered
        probe["block0"] = _statuses(model.blocks[0].parameters())
        probe["block1"] = _statuses(model.blocks[1].parameters())
        probe["active"] = set(model.blocks[0].fc.weight.ds_active_sub_modules)

    handle = model.blocks[0].register_forward_pre_hook(look)
    losses = train_engine(engine, batches(2), rank, world)
    handle.remove()
    out.update(probe=probe, complete=coordinator.is_complete_trace(),
               active_after=set(model.blocks[0].fc.weight.ds_active_sub_modules),
               outside=_statuses(model.parameters()))
    out["generation"] = _generate_like_trl(engine, batches(1)[0][0][:2])
    out["invalid_after_generation"] = coordinator.is_invalid_trace()
    losses += train_engine(engine, batches(4)[2:], rank, world)
    out["complete_again"] = coordinator.is_complete_trace()
    out["prefetched_last_step"] = engine.last_step_stats.prefetched

    # Registering again hooks nothing twice; removed hooks are really gone (the params are
    # placeholders without them), and registering brings the gathers back.
    offload._register_deepspeed_module(model)
    out["block0_hooks"] = (len(model.blocks[0]._forward_pre_hooks),
                           len(model.blocks[0]._forward_hooks))
    out["block0_fc_hooks"] = (len(model.blocks[0].fc._forward_pre_hooks),
                              len(model.blocks[0].fc._forward_hooks))
    offload._remove_module_hooks()
    x = batches(1)[0][0][:2]
    with torch.no_grad():
        try:
            model(x)
            out["unhooked_forward"] = "ran"
        except RuntimeError as e:
            out["unhooked_forward"] = type(e).__name__
        offload._register_deepspeed_module(model)
        out["rehooked_logits"] = model(x)
    coordinator._invalidate_trace()  # the forward above recorded an order: valid
    errors = {}
    for name, call in {"already_invalid": coordinator._invalidate_trace,
                       "foreign": lambda: offload._register_deepspeed_module(nn.Linear(2, 2)),
                       "inside_unit": lambda: offload._register_deepspeed_module(
                           model.blocks[0].fc),
                       "not_a_module": lambda: offload._register_deepspeed_module("model")}.items():
        try:
            call()
            errors[name] = None
        except (ZeroliteStateError, ZeroliteConfigError) as e:
            errors[name] = (type(e).__name__, str(e))
    out["errors"] = errors

    stage2, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=2))
    out["stage2_has_offload"] = hasattr(stage2.optimizer, "parameter_offload")
    return losses, out


def _plain_logits(steps, x):
    _, state = reference_run(steps)
    model = tiny_gpt()
    model.load_state_dict(state)
    with torch.no_grad():
        return model(x)


def test_trl_generation_round_trip_keeps_training_exact():
    ref_losses, _ = reference_run(4)
    losses, out = run_ranks(_trl_generation_round_trip, 2)[0]
    # Training through the round trip is the plain run's (gathers happen again after it).
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    assert out["offload_module_is_model"] and out["invalid_at_start"]
    # 3 units (root, 2 blocks) x (gather/release, arm backward), and a direct-call pair on each
    # of the 16 modules holding parameters (4 in the root unit, 6 per block)
    assert out["hooks"] == HOOKS
    # ds_status in block 0's forward of a step with a recorded order: block 1 is prefetched.
    assert out["probe"] == {"block0": ["AVAILABLE"], "block1": ["INFLIGHT"], "active": {1}}
    assert out["complete"] and out["active_after"] == set() and out["outside"] == ["NOT_AVAILABLE"]

    gen = out["generation"]
    assert gen["inside"] == ["AVAILABLE"] and gen["external"] == []
    assert gen["module_hooks_left"] == 0 and gen["gathers_while_unhooked"] == 0
    x = batches(1)[0][0][:2]
    torch.testing.assert_close(gen["logits"], _plain_logits(2, x), rtol=1e-5, atol=1e-5)
    assert gen["invalid_after_invalidate"]
    assert gen["after"] == ["NOT_AVAILABLE"] and gen["numel_after"] == 0
    assert gen["hooks_after"] == HOOKS
    assert out["invalid_after_generation"]  # the next step records afresh ...
    assert out["complete_again"] and out["prefetched_last_step"] > 0  # ... and prefetches again

    assert out["block0_hooks"] == (2, 2)  # not hooked twice
    assert out["block0_fc_hooks"] == (1, 1)
    assert out["unhooked_forward"] == "RuntimeError"
    torch.testing.assert_close(out["rehooked_logits"], _plain_logits(4, x), rtol=1e-5, atol=1e-5)
    errors = out["errors"]
    assert errors["already_invalid"][0] == "ZeroliteStateError"
    assert "not part of the model" in errors["foreign"][1]
    assert "inside a unit" in errors["inside_unit"][1]
    assert "expected the engine's module" in errors["not_a_module"][1]
    assert out["stage2_has_offload"] is False  # as DeepSpeed's stage-1/2 optimizer


def _without_optimizer(rank, world):
    cfg = ds_config(world, stage=3, gas=1)
    del cfg["optimizer"]
    model = tiny_gpt()
    engine, optimizer, _, scheduler = zerolite.initialize(model=model, config=cfg)
    out = {"returned_is_offload": optimizer is engine.optimizer
           and optimizer is engine.sharded.parameter_offload, "scheduler": scheduler,
           "lr": engine.get_lr(), "has_nested_offload": hasattr(optimizer, "parameter_offload")}
    x = batches(1)[0][0][:2]
    out["generation"] = _generate_like_trl(engine, x)
    with torch.no_grad():
        out["forward_after"] = engine(x)
    engine.backward(F.cross_entropy(engine(x).flatten(0, 1), x.flatten()))
    try:
        engine.step()
        out["step"] = "ran"
    except ZeroliteStateError as e:
        out["step"] = str(e)
    cfg = ds_config(world, stage=2)
    del cfg["optimizer"]
    stage2, optimizer2, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    out["stage2_optimizer"] = (optimizer2, stage2.optimizer)
    return out


def test_stage3_engine_without_optimizer_returns_the_hook_owner_as_deepspeed_does():
    """DeepSpeed's initialize without an optimizer at stage 3 returns (and keeps as
    engine.optimizer) its DeepSpeedZeRoOffload; TRL's generation helpers remove and restore the
    hooks of such a reference model through it. Below stage 3 there is none (None)."""
    out = run_ranks(_without_optimizer, 2)[0]
    assert out["returned_is_offload"] and not out["has_nested_offload"]
    assert out["scheduler"] is None and out["lr"] == []
    gen = out["generation"]
    assert gen["module_hooks_left"] == 0 and gen["gathers_while_unhooked"] == 0
    x = batches(1)[0][0][:2]
    plain = _plain_logits(0, x)
    torch.testing.assert_close(gen["logits"], plain, rtol=1e-5, atol=1e-5)
    assert gen["after"] == ["NOT_AVAILABLE"] and gen["hooks_after"] == HOOKS
    torch.testing.assert_close(out["forward_after"], plain, rtol=1e-5, atol=1e-5)
    assert "engine.step(): no optimizer" in out["step"]
    assert out["stage2_optimizer"] == (None, None)


# -- a custom autograd Function that saves a parameter (TRL's chunked loss) -------------------
class _HeadLoss(torch.autograd.Function):
    """Cross-entropy of hidden @ weight.T; backward reads the saved weight as TRL's does: gather
    it first unless `ds_status` says it is AVAILABLE."""

    @staticmethod
    def forward(ctx, hidden, weight, targets):
        ctx.save_for_backward(hidden, weight, targets)
        return F.cross_entropy(hidden @ weight.t(), targets)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets = ctx.saved_tensors
        status = getattr(weight, "ds_status", AVAILABLE)  # a plain model: no attribute
        statuses = getattr(_HeadLoss, "statuses", None)
        if statuses is not None:
            statuses.append(status.name)
        gather = [weight] if status != AVAILABLE else []
        with torch.enable_grad(), GatheredParameters(gather):
            h = hidden.detach().requires_grad_()
            w = weight.detach().requires_grad_()
            loss = F.cross_entropy(h @ w.t(), targets)
            gh, gw = torch.autograd.grad(loss, (h, w))
        return gh * grad, gw * grad, None


class Head(nn.Linear):
    pass


class FusedLossGPT(GPT):
    """The tiny GPT with an untied head whose loss is a custom Function reading the weight."""

    def __init__(self):
        super().__init__(GPTConfig(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=32,
                                   tie_embeddings=False))
        head = Head(32, 256, bias=False)
        head.weight.data.copy_(self.lm_head.weight.data)
        self.lm_head = head

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        hidden = self.ln_f(x).reshape(-1, x.shape[-1])
        w = self.lm_head.weight
        # TRL's maybe_gather_lm_head_ctx: gather unless already AVAILABLE
        gather = [w] if hasattr(w, "ds_status") and w.ds_status != ZeroParamStatus.AVAILABLE \
            else []
        with GatheredParameters(gather):
            return _HeadLoss.apply(hidden, w, targets.reshape(-1))


def _fused_model():
    torch.manual_seed(0)
    return FusedLossGPT()


def _fused_loss_runs(rank, world):
    out = {}
    for name, policy in {"head_in_root": None, "head_own_unit": ["Block", "Head"]}.items():
        _HeadLoss.statuses = []
        engine, *_ = zerolite.initialize(model=_fused_model(), unit_policy=policy,
                                         config=ds_config(world, stage=3))
        losses = train_engine(engine, batches(3), rank, world)
        x, y = batches(1)[0]
        loss = engine(x[:2], y[:2])
        blocked = engine.sharded.pool.reuse_blocked  # between forward and backward
        engine.backward(loss)
        out[name] = (losses, sorted(set(_HeadLoss.statuses)), blocked)
    _HeadLoss.statuses = None
    with Init():  # zero.Init params carry ds_status too
        lin = nn.Linear(4, 4)
    out["init"] = [lin.weight.ds_status.name]
    with GatheredParameters(lin.weight):
        out["init"].append(lin.weight.ds_status.name)
    out["init"].append(lin.weight.ds_status.name)
    return out


def test_custom_function_saving_a_param_reads_ds_status_in_backward():
    ref_losses, _ = train_reference(copy.deepcopy(_fused_model()), batches(3), adamw, clip=CLIP)
    out = run_ranks(_fused_loss_runs, 2)[0]
    # Head in the root unit: gathered through backward, the Parameter itself comes back.
    losses, statuses, blocked = out["head_in_root"]
    assert statuses == ["AVAILABLE"] and not blocked
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    # Head as a unit of its own, read outside its forward: released after the gather in
    # forward, NOT_AVAILABLE in backward, gathered there by the Function (as under DeepSpeed).
    # Its buffer may be viewed by what the root level saved: not reused until backward ends.
    losses, statuses, blocked = out["head_own_unit"]
    assert statuses == ["NOT_AVAILABLE"] and blocked
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    assert out["init"] == ["NOT_AVAILABLE", "AVAILABLE", "NOT_AVAILABLE"]


def test_compat_exports_zero_param_status_and_type():
    from zerolite.compat.deepspeed import zero
    from zerolite.compat.deepspeed.runtime.zero import partition_parameters

    for enum_type in (ZeroParamStatus, ZeroParamType):
        assert getattr(partition_parameters, enum_type.__name__) is enum_type
        assert getattr(zero, enum_type.__name__) is enum_type
    assert [s.value for s in ZeroParamStatus] == [1, 2, 3]  # DeepSpeed's values
    assert [(t.name, t.value) for t in ZeroParamType] == [
        ("NORMAL", 1), ("PARTITIONED", 2), ("REMOTE", 3)]
    engine_types, init_types = run_ranks(_param_types, 1)[0]
    assert engine_types == init_types == {ZeroParamType.PARTITIONED}


def _param_types(rank, world):
    with Init():
        inside = tiny_gpt()
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=3))
    return ({p.ds_param_type for p in engine.module.parameters()},
            {p.ds_param_type for p in inside.parameters()})


# -- DeepSpeed's own unwrap_model_for_generation (deepspeed.zero / runtime.zero.stage3) ------
def _deepspeed_unwrap(rank, world):
    from zerolite.compat.deepspeed import zero as ds_zero

    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=3))
    offload = engine.optimizer.parameter_offload
    losses = train_engine(engine, batches(2), rank, world)
    x = batches(1)[0][0][:2]
    out = {}
    with ds_zero.unwrap_model_for_generation(engine) as unwrapped:
        gathers = engine.sharded.stats.current.gathers
        out["same"] = unwrapped is engine
        out["inside"] = _statuses(engine.module.parameters())
        out["hooks_inside"] = sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                                  for m in engine.module.modules())
        with torch.no_grad():
            out["logits"] = [unwrapped(x) for _ in range(3)][-1]
        out["gathers_inside"] = engine.sharded.stats.current.gathers - gathers
    out["after"] = _statuses(engine.module.parameters())
    out["numel_after"] = sum(p.numel() for p in engine.module.parameters())
    out["hooks_after"] = (len(offload.forward_hooks), len(offload.backward_hooks))
    losses += train_engine(engine, batches(4)[2:], rank, world)
    try:
        with ds_zero.unwrap_model_for_generation(engine.module):
            pass
        out["plain_module"] = None
    except ZeroliteConfigError as e:
        out["plain_module"] = str(e)
    return losses, out


def test_deepspeed_unwrap_model_for_generation_gathers_once_and_training_goes_on():
    ref_losses, _ = reference_run(4)
    losses, out = run_ranks(_deepspeed_unwrap, 2)[0]
    assert out["same"] and out["inside"] == ["AVAILABLE"] and out["hooks_inside"] == 0
    assert out["gathers_inside"] == 0  # three forwards, not one gather
    torch.testing.assert_close(out["logits"], _plain_logits(2, batches(1)[0][0][:2]),
                               rtol=1e-5, atol=1e-5)
    assert out["after"] == ["NOT_AVAILABLE"] and out["numel_after"] == 0
    assert out["hooks_after"] == HOOKS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    assert "expected the engine deepspeed.initialize returned, got GPT" in out["plain_module"]


def _ds_tensors(rank, world):
    from zerolite.zero.sharded_model import gather_full_state_dict

    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=3))
    named = dict(engine.module.named_parameters())
    before = {n: p.ds_tensor.clone() for n, p in named.items()}
    train_engine(engine, batches(1), rank, world)
    after = {n: p.ds_tensor.clone() for n, p in named.items()}
    return before, after, gather_full_state_dict(engine.sharded), {
        n: p.ds_numel for n, p in named.items()}


def test_ds_tensor_is_this_ranks_live_piece_of_the_param():
    """Each rank's `param.ds_tensor` holds its part of the param; the parts of all ranks, in
    rank order, are the param, and they follow the optimizer step (a view, not a copy)."""
    ranks = run_ranks(_ds_tensors, 2)
    initial = dict(tiny_gpt().named_parameters())
    for name, numel in ranks[0][3].items():
        full = ranks[0][2][name]
        before = torch.cat([r[0][name] for r in ranks])
        after = torch.cat([r[1][name] for r in ranks])
        assert before.numel() == after.numel() == numel == full.numel(), name
        torch.testing.assert_close(before, initial[name].detach().reshape(-1), rtol=0, atol=0)
        torch.testing.assert_close(after, full.reshape(-1), rtol=0, atol=0)
        assert not torch.equal(before, after), name


class _DirectCalls(nn.Module):
    """The computation the test runs through submodules called on their own: the root unit's
    ln_f and block 1's fc, never the model's or the block's forward."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, h, _targets=None):
        return self.model.blocks[1].fc(self.model.ln_f(h)).square().mean()


def _direct_inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (8, 16), generator=g)
    return ids, [torch.randn(8, 16, 32, generator=g) for _ in range(3)]


def _direct_calls(rank, world):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, gas=1))
    model = engine.module
    ids, hs = _direct_inputs()
    out = {}
    with torch.no_grad():
        out["emb"] = model.tok_emb(ids)  # the root unit, gathered for the call ...
        out["fc"] = model.blocks[1].fc(hs[0])
    out["after_no_grad"] = _statuses(engine.parameters())  # ... and released after it
    losses = []
    for h in hs:
        loss = _DirectCalls(model)(h[rank * 4:(rank + 1) * 4])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    out["after_steps"] = _statuses(engine.parameters())
    out["losses"] = losses
    out["params"] = gather_full_state_dict(engine.sharded)
    return out


def test_modules_called_on_their_own_gather_train_and_release():
    ids, hs = _direct_inputs()
    plain = tiny_gpt()
    with torch.no_grad():
        emb, fc = plain.tok_emb(ids), plain.blocks[1].fc(hs[0])
    ref = _DirectCalls(tiny_gpt())
    _, ref_params = train_reference(ref, [(h, h) for h in hs], adamw, clip=CLIP)
    moved = ref_params["model.blocks.1.fc.weight"] - tiny_gpt().blocks[1].fc.weight
    assert moved.abs().max() > 1e-4  # the reference trains what the direct calls touch
    for rank, out in enumerate(run_ranks(_direct_calls, 2)):
        torch.testing.assert_close(out["emb"], emb, rtol=0, atol=0)
        torch.testing.assert_close(out["fc"], fc, rtol=1e-6, atol=1e-6)
        assert out["after_no_grad"] == out["after_steps"] == ["NOT_AVAILABLE"]
        # What the calls used; the others get no gradient, so torch's AdamW leaves them
        # alone while a flat-shard optimizer (DeepSpeed's, zerolite's) decays them.
        for name in ("ln_f.weight", "ln_f.bias", "blocks.1.fc.weight", "blocks.1.fc.bias"):
            torch.testing.assert_close(out["params"][name], ref_params["model." + name],
                                       rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
