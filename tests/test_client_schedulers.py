"""A torch LR scheduler over a client optimizer with two param groups drives every group of the
optimizer the engine steps, however it reaches the engine: passed to `initialize` (object or
callable), held and stepped by the user (as Accelerate does), or created after `initialize` over
the client optimizer or over the returned one; and across save_checkpoint / load_checkpoint.
World 2, ZeRO-3, fp32, against plain single-process PyTorch: losses and the lr of each group
at each step."""

import pytest
import torch

import zerolite
from zerolite.errors import ZeroliteConfigError
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference

from gpt_cases import CLIP, LR, batches, ds_config, tiny_gpt

STEPS, SAVE_AT = 6, 3
# One lambda per group: each group's lr moves on its own, from zero (warm-up) up.
LAMBDAS = [lambda s: min(1.0, s / 2), lambda s: 0.5 ** s]


def groups(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(g):
    return torch.optim.AdamW(g, lr=LR, betas=(0.8, 0.95))


def lambda_lr(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, LAMBDAS)


def _config(world):
    cfg = ds_config(world)
    del cfg["optimizer"]  # the client's
    return cfg


def _engine(world, mode, ckpt):
    model = tiny_gpt()
    cfg = _config(world)
    if mode == "held_nvme":  # the engine steps a chunked wrapper around the client optimizer
        cfg["zero_optimization"].update(sub_group_size=100, offload_optimizer={
            "device": "nvme", "nvme_path": f"{ckpt}-swap"})
        cfg["zero_force_ds_cpu_optimizer"] = False  # torch AdamW offloaded, as DeepSpeed asks
    client = adamw(groups(model))
    kwargs = {}
    held = lambda_lr(client) if mode in ("held", "held_nvme", "resume") else None
    if mode == "passed":
        kwargs["lr_scheduler"] = lambda_lr(client)
    elif mode == "passed_callable":
        kwargs["lr_scheduler"] = lambda_lr
    engine, optimizer, _, _ = zerolite.initialize(model=model, optimizer=client, config=cfg,
                                                  **kwargs)
    if mode == "after_client":
        held = lambda_lr(client)
    elif mode == "after_returned":
        held = lambda_lr(optimizer)
    return engine, held


def _steps(engine, held, rank, world, todo):
    losses, lrs = [], []
    for batch in todo:
        lrs.append(engine.get_lr())  # what this step is about to use
        losses += train_engine(engine, [batch], rank, world)
        if held is not None:
            held.step()
    return losses, lrs


def _train(rank, world, mode, ckpt=None):
    engine, held = _engine(world, mode, ckpt)
    if mode != "resume":
        return _steps(engine, held, rank, world, batches(STEPS))
    losses, lrs = _steps(engine, held, rank, world, batches(STEPS)[:SAVE_AT])
    engine.save_checkpoint(ckpt, client_state={"sched": held.state_dict()})
    # A new process would start here: fresh model, optimizer and scheduler (lr back at 0).
    engine, held = _engine(world, mode, ckpt)
    _, client_state = engine.load_checkpoint(ckpt)
    held.load_state_dict(client_state["sched"])
    more = _steps(engine, held, rank, world, batches(STEPS)[SAVE_AT:])
    return losses + more[0], lrs + more[1]


def _reference():
    model = tiny_gpt()
    lrs = []
    probe = adamw(groups(tiny_gpt()))
    sched = lambda_lr(probe)
    for _ in range(STEPS):
        lrs.append([g["lr"] for g in probe.param_groups])
        probe.step()
        sched.step()
    losses, _ = train_reference(model, batches(STEPS), adamw, clip=CLIP, params=groups(model),
                                make_scheduler=lambda_lr)
    return losses, lrs


@pytest.mark.parametrize("mode", ["passed", "passed_callable", "held", "held_nvme",
                                  "after_client", "after_returned", "resume"])
def test_client_scheduler_drives_every_group(mode, tmp_path):
    ref_losses, ref_lrs = _reference()
    assert ref_lrs[0] == [0.0, LR] and ref_lrs[1] == [LR / 2, LR / 2]  # the groups differ
    for losses, lrs in run_ranks(_train, 2, mode, str(tmp_path / "ckpt")):
        assert lrs == ref_lrs
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5,
                                   atol=0)


def _adopted(rank, world):
    model = tiny_gpt()
    client = adamw(groups(model))
    engine, optimizer, _, _ = zerolite.initialize(model=model, optimizer=client,
                                                  config=_config(world))
    shards = {id(f.master) for f in engine.sharded.flats}
    in_groups = [id(p) for g in client.param_groups for p in g["params"]]
    # As DeepSpeed: initialize returns the ZeRO optimizer, around the client's own.
    return (optimizer.optimizer is client and engine.basic_optimizer is client,
            set(in_groups) == shards, len(in_groups) == len(shards))


def test_client_optimizer_is_the_one_stepped_over_the_shards():
    assert run_ranks(_adopted, 2) == [(True, True, True)] * 2


def _reused(rank, world):
    model = tiny_gpt()
    client = adamw(groups(model))
    cfg = _config(world)
    zerolite.initialize(model=model, optimizer=client, config=cfg)
    try:
        zerolite.initialize(model=tiny_gpt(), optimizer=client, config=cfg)
    except ZeroliteConfigError as e:
        return str(e)
    return None


def test_optimizer_of_another_model_is_refused():
    msg = run_ranks(_reused, 2)[0]
    assert msg is not None and "not parameters of the model" in msg
