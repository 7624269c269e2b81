"""GatheredParameters: full values of sharded params for a block of user code; edits made
with modifier_rank reach every rank and the fp32 masters; nesting and several units; also
zero.Init params before the engine exists."""
import copy

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero import GatheredParameters
from zerolite.zero.sharded_model import gather_full_state_dict
from zerolite.zero.unit import UnitState

from gpt_cases import CLIP, adamw, batches, ds_config, reference_run, tiny_gpt

STEPS = 3


def _read_after_training(rank, world):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    train_engine(engine, batches(), rank, world)
    out, sizes_inside = {}, []
    for name, p in model.named_parameters():
        with GatheredParameters(p):
            out[name] = p.detach().clone()
            sizes_inside.append(p.numel() == p.ds_numel)
        assert p.numel() == 0, f"{name} still gathered after the context"
    return out, all(sizes_inside), engine.sharded.gathered_nbytes()


def test_read_stage3_params_equals_reference():
    _, ref_params = reference_run()
    values, full_inside, left = run_ranks(_read_after_training, 2)[1]
    assert full_inside and left == 0
    for name, value in values.items():
        torch.testing.assert_close(value, ref_params[name], rtol=1e-5, atol=1e-5, msg=name)


def _edit_then_train(rank, world, stage, names, extra):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=stage, **extra))
    params = dict(model.named_parameters())
    targets = [params[n] for n in names]
    with GatheredParameters(targets + [None], modifier_rank=0):
        if rank == 0:
            for p in targets:
                p.data.fill_(1.0) if p.dim() == 1 else torch.nn.init.eye_(p.data)
    # Visible everywhere right after the context ...
    visible = []
    for p in targets:
        with GatheredParameters(p):
            visible.append(p.detach().clone())
    state = gather_full_state_dict(engine.sharded)  # ... and in the fp32 masters
    losses = train_engine(engine, batches(STEPS), rank, world)
    return visible, {n: state[n] for n in names}, losses, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("stage,extra", [
    (3, {}),  # strict residency: units gathered only for the context
    (3, {"zero_optimization": {"stage": 3}}),  # default persistence: small units stay gathered
    (2, {}),  # always gathered
], ids=["stage3", "stage3-persistent", "stage2"])
def test_modifier_rank_edit_reaches_all_ranks_and_training(stage, extra):
    # Params from the root unit (tied embedding, bias) and from two different blocks.
    names = ["tok_emb.weight", "blocks.0.fc.bias", "blocks.1.attn.proj.weight", "ln_f.bias"]
    ref = tiny_gpt()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n in names:
                p.fill_(1.0) if p.dim() == 1 else torch.nn.init.eye_(p)
    expected = {n: p.detach().clone() for n, p in ref.named_parameters() if n in names}
    ref_losses, ref_params = train_reference(copy.deepcopy(ref), batches(STEPS), adamw, clip=CLIP)
    for visible, masters, losses, params in run_ranks(_edit_then_train, 2, stage, names, extra):
        for n, v, m in zip(names, visible, masters.values()):
            torch.testing.assert_close(v, expected[n], rtol=0, atol=0, msg=n)
            torch.testing.assert_close(m, expected[n], rtol=0, atol=0, msg=n)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5,
                                   atol=0)
        for name, value in ref_params.items():
            torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-5, msg=name)


def _nested_and_frozen(rank, world):
    model = tiny_gpt()
    model.ln_f.weight.requires_grad_(False)  # a frozen flat: no master, edits go to its shard
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    units = engine.sharded.units
    b0, b1 = model.blocks[0], model.blocks[1]
    with GatheredParameters(b0.fc.weight):
        assert units[1].state is UnitState.GATHERED and units[2].state is UnitState.SHARDED
        with GatheredParameters([b0.out.weight, b1.fc.weight, model.ln_f.weight], modifier_rank=1):
            assert units[2].state is UnitState.GATHERED and units[0].state is UnitState.GATHERED
            if rank == 1:
                model.ln_f.weight.data.mul_(3.0)
                b1.fc.weight.data.zero_()
        # inner exit released what it gathered (blocks.1, root) but not blocks.0
        inner_released = units[2].state is UnitState.SHARDED and units[0].state is UnitState.SHARDED
        outer_kept = units[1].state is UnitState.GATHERED and b0.fc.weight.numel() > 0
    all_released = engine.sharded.gathered_nbytes() == 0
    state = gather_full_state_dict(engine.sharded)
    return (inner_released, outer_kept, all_released, state["ln_f.weight"],
            state["blocks.1.fc.weight"])


def test_nested_contexts_several_units_and_frozen_params():
    ref = tiny_gpt()
    for inner_released, outer_kept, all_released, ln_f, fc in run_ranks(_nested_and_frozen, 2):
        assert inner_released and outer_kept and all_released
        torch.testing.assert_close(ln_f, ref.ln_f.weight.detach() * 3.0)
        assert torch.count_nonzero(fc) == 0


def _zero_init_params(rank, world):
    with zerolite.zero.Init():
        model = tiny_gpt()
    w, b = model.blocks[0].fc.weight, model.blocks[0].fc.bias
    with GatheredParameters([w, b]):
        read = w.detach().clone()
        with GatheredParameters(w, modifier_rank=0):  # nested: stays full after the inner exit
            if rank == 0:
                w.data.add_(0.5)
        still_full = w.numel() == w.ds_numel and w.zl_partitioned.gathered == 1
    placeholder_again = torch.isnan(w).all().item() and w.untyped_storage().nbytes() <= 4
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    return read, still_full, placeholder_again, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("world", [2, 4])
def test_zero_init_params_before_initialize(world):
    ref = tiny_gpt()
    for read, still_full, placeholder, state in run_ranks(_zero_init_params, world):
        assert still_full and placeholder
        torch.testing.assert_close(read, ref.blocks[0].fc.weight.detach(), rtol=0, atol=0)
        torch.testing.assert_close(state["blocks.0.fc.weight"],
                                   ref.blocks[0].fc.weight.detach() + 0.5, rtol=0, atol=0)
        torch.testing.assert_close(state["blocks.1.fc.weight"],
                                   ref.blocks[1].fc.weight.detach(), rtol=0, atol=0)


class _ExternalUser(torch.nn.Module):
    """A block whose forward reads a parameter it does not own (its owner's `scale`)."""

    def __init__(self, owner):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self._owner = [owner]  # a list: not a submodule, so `scale` is external to this block

    def forward(self, x):
        return torch.tanh(self.fc(x) * self._owner[0].scale)


class _ExternalModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 16))
        self.blocks = torch.nn.ModuleList([_ExternalUser(self) for _ in range(2)])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x, y):
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.mse_loss(self.head(x), y)


def _external_data():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]


def _external_train(rank, world):
    torch.manual_seed(0)
    model = _ExternalModel()
    for block in model.blocks:  # what a DeepSpeed user writes; zerolite needs no action
        zerolite.zero.register_external_parameter(block, model.scale)
    cfg = {"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.2}},
           "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "stage3_max_reuse_distance": 0}}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses = []
    for x, y in _external_data():
        lo = rank * 8 // world
        loss = engine(x[lo:lo + 8 // world], y[lo:lo + 8 // world])
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    return losses, gather_full_state_dict(engine.sharded)


def test_parameter_used_outside_its_module_trains_like_reference():
    """register_external_parameter is a no-op because a root parameter read inside a block
    is gathered with the root unit (its docstring's claim): stage 3 matches plain PyTorch."""
    torch.manual_seed(0)
    ref = _ExternalModel()
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    ref_losses = []
    for x, y in _external_data():
        loss = ref(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(loss.item())
    losses, state = run_ranks(_external_train, 2)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_external_parameter_calls_leave_plain_params_alone():
    m = torch.nn.Linear(2, 2)
    before = m.weight.detach().clone()
    zerolite.zero.register_external_parameter(m, m.weight)
    zerolite.zero.unregister_external_parameter(m, m.weight)
    with GatheredParameters([m.weight, None], modifier_rank=0):  # plain params, 1 process
        m.weight.data.add_(1.0)
    assert torch.equal(m.weight, before + 1.0) and isinstance(m.weight, torch.nn.Parameter)
