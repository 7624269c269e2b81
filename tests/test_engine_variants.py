"""Frozen params, a module called twice per forward, and eval under no_grad, against the
single-process reference."""
import copy

import torch

import zerolite
from zerolite.models import GPT
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, TINY, adamw, batches, ds_config, tiny_gpt

STEPS = 8


class BlockTwiceGPT(GPT):
    """Runs block 0, block 1, then block 0 again: one unit gathered twice per forward."""

    def forward(self, idx, targets=None):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        for block in (self.blocks[0], self.blocks[1], self.blocks[0]):
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def frozen_gpt():
    model = tiny_gpt()
    model.pos_emb.weight.requires_grad_(False)
    model.blocks[0].ln1.requires_grad_(False)
    model.blocks[1].fc.requires_grad_(False)
    return model


def twice_gpt():
    torch.manual_seed(0)
    return BlockTwiceGPT(TINY)


def _train(rank, world, make_model):
    model = make_model()
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = zerolite.initialize(model=model, model_parameters=params, config=ds_config(world))
    losses = train_engine(engine, batches(STEPS), rank, world)
    engine.eval()
    x, _ = batches(STEPS + 1)[-1]
    with torch.no_grad():
        logits = engine(x)
    still_gathered = engine.sharded.gathered_nbytes()
    return losses, gather_full_state_dict(engine.sharded), logits, still_gathered


def _check(make_model, world=2):
    model = make_model()
    ref_losses, ref_params = train_reference(
        copy.deepcopy(model), batches(STEPS),
        lambda ps: adamw([p for p in ps if p.requires_grad]), clip=CLIP)
    ref_model = make_model()
    ref_model.load_state_dict(ref_params)
    ref_model.eval()
    x, _ = batches(STEPS + 1)[-1]
    with torch.no_grad():
        ref_logits = ref_model(x)
    losses, params, logits, still_gathered = run_ranks(_train, world, make_model)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
    assert still_gathered == 0
    return params


def test_frozen_params_stay_frozen_and_match():
    params = _check(frozen_gpt)  # zerolite's trained params (matched against the reference)
    initial = frozen_gpt().state_dict()
    for name in ("pos_emb.weight", "blocks.1.fc.weight"):  # bit-exact: never updated
        torch.testing.assert_close(params[name], initial[name], rtol=0, atol=0, msg=name)


def test_module_called_twice_in_one_forward():
    _check(twice_gpt)


def test_eval_under_no_grad_world4():
    _check(tiny_gpt, world=4)
