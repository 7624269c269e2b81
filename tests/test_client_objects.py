"""Param groups with different weight decay, a client torch.optim optimizer, and client /
config LR schedulers — each against the single-process reference."""

import torch

import zerolite
from zerolite.optim.grad_norm import clip_grads_
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, LR, batches, ds_config, tiny_gpt

STEPS = 6


def groups(model):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def _lambda(step):
    return 1.0 / (1 + step)


def _train(rank, world, mode):
    model = tiny_gpt()
    cfg = ds_config(world)
    kwargs = {"model_parameters": groups(model)}
    if mode == "client":
        del cfg["optimizer"]
        client = torch.optim.AdamW(groups(model), lr=LR, betas=(0.8, 0.95), eps=1e-7)
        kwargs["optimizer"] = client
        kwargs["lr_scheduler"] = torch.optim.lr_scheduler.LambdaLR(client, _lambda)
    engine, optimizer, _, sched = zerolite.initialize(model=model, config=cfg, **kwargs)
    lrs = []
    losses = []
    for batch in batches(STEPS):
        losses += train_engine(engine, [batch], rank, world)
        lrs.append(engine.get_lr())
    hp = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return losses, gather_full_state_dict(engine.sharded), lrs, hp


def _reference(make_opt, lambda_sched=False):
    model = tiny_gpt()
    opt = make_opt(groups(model))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lambda) if lambda_sched else None
    losses, lrs = [], []
    for x, y in batches(STEPS):
        loss = model(x, y)
        loss.backward()
        clip_grads_([p.grad for p in model.parameters()], CLIP)
        opt.step()
        opt.zero_grad()
        if sched:
            sched.step()
        losses.append(loss.item())
        lrs.append([g["lr"] for g in opt.param_groups])
    return losses, model.state_dict(), lrs


def _compare(got, ref):
    losses, params, lrs, _ = got
    ref_losses, ref_params, ref_lrs = ref
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-5, msg=name)
    assert lrs == ref_lrs


def test_param_groups_with_different_weight_decay():
    got = run_ranks(_train, 2, "groups")[0]
    ref = _reference(lambda g: torch.optim.AdamW(g, lr=LR))
    _compare(got, ref)
    assert [h["weight_decay"] for h in got[3]] == [0.1, 0.0]


def test_client_optimizer_and_scheduler_are_retargeted_to_shards():
    got = run_ranks(_train, 2, "client")[0]
    ref = _reference(lambda g: torch.optim.AdamW(g, lr=LR, betas=(0.8, 0.95), eps=1e-7),
                     lambda_sched=True)
    _compare(got, ref)
    assert got[3][0]["betas"] == (0.8, 0.95) and got[3][0]["eps"] == 1e-7
