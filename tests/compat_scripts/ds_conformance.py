"""DeepSpeed conformance client: small programs written against DeepSpeed's documented API
only, each recording what a program can observe (losses, learning rates, counters, grad
norms, checkpoint files and client_state, dataloader order, partitioned-parameter attributes).
The same file runs under real DeepSpeed (tools/ds_golden.py records tests/ds_golden/) and
under `zerolite.as_deepspeed` (tests/test_ds_conformance.py compares the two).

    torchrun --nproc_per_node 2 ds_conformance.py --out DIR [--only a,b]

Each rank writes DIR/rank{r}.json: {scenario: record}; a scenario that raises records
{"error": "<type>: <message>"} and the next one still runs.
"""
import argparse
import gc
import json
import os
import sys
import traceback

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

IN, HIDDEN, OUT = 8, 16, 4


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.LayerNorm(HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, OUT))


def batches(n, micro, seed=1):
    """n micro-batches of this rank: the global batch of each is split in rank order."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(micro * world, IN, generator=g)
        y = torch.randn(micro * world, OUT, generator=g)
        out.append((x[rank * micro:(rank + 1) * micro], y[rank * micro:(rank + 1) * micro]))
    return out


def adamw(lr=1e-3, wd=0.1, kind="AdamW"):
    return {"type": kind, "params": {"lr": lr, "betas": [0.9, 0.99], "eps": 1e-8,
                                     "weight_decay": wd, "torch_adam": True}}


def config(stage, micro=2, gas=1, clip=0.0, **extra):
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
           "gradient_clipping": clip, "steps_per_print": 10**6,
           "zero_optimization": {"stage": stage}}
    cfg.update(extra)
    return cfg


def number(v):
    """A float, or None; tensors become their value (the type is recorded apart)."""
    if v is None:
        return None
    if torch.is_tensor(v):
        return float(v.detach().float().item())
    return float(v)


def kind(v):
    """The type a program sees: a tensor's dtype too."""
    return f"Tensor {v.dtype}" if torch.is_tensor(v) else type(v).__name__


def counters(engine):
    return {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "micro_steps": engine.micro_steps, "skipped_steps": engine.skipped_steps}


def checksum(engine):
    """Every parameter's float64 sum, gathered (a no-op below stage 3)."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        return [float(p.detach().double().sum()) for p in params]


def initialized(make_model, cfg, zero_init=False):
    """The engine over `make_model()` (built under zero.Init when asked) with `cfg`."""
    if zero_init:
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = make_model()
    else:
        model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    return engine


def train(engine, data, cast=None):
    """Forward/backward/step per micro-batch; what the program sees after each."""
    rows = []
    for x, y in data:
        if cast is not None:
            x = x.to(cast)
        out = engine(x)
        loss = F.mse_loss(out.float(), y)
        boundary = engine.is_gradient_accumulation_boundary()
        returned = engine.backward(loss)
        stepped = engine.step()
        norm = engine.get_global_grad_norm()
        rows.append({"loss": float(loss.item()), "boundary": bool(boundary),
                     "backward_returned": number(returned),
                     "backward_returned_type": kind(returned), "step_returned": kind(stepped),
                     "lr": engine.get_lr(), "mom": engine.get_mom(),
                     "step_applied": engine.was_step_applied(),
                     "grad_norm": number(norm), "grad_norm_type": kind(norm),
                     "out_dtype": str(out.dtype), **counters(engine)})
    return rows


# -- scenarios ------------------------------------------------------------------------


def config_optimizer_scheduler_gas(tmp):
    """ZeRO-3, optimizer and WarmupDecayLR from the config, accumulation 2, clipping 0.5."""
    cfg = config(3, micro=2, gas=2, clip=0.5, optimizer=adamw(),
                 scheduler={"type": "WarmupDecayLR", "params": {
                     "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 3,
                     "total_num_steps": 10}})
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    model = mlp()
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg)
    rec = {"norm_before_step": number(engine.get_global_grad_norm()),
           "lr_before": engine.get_lr(),
           "sizes": [engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                     engine.gradient_accumulation_steps()],
           "scheduler_last_lr": None, "returned_scheduler": scheduler is not None}
    rec["steps"] = train(engine, batches(8, 2))
    rec["scheduler_last_lr"] = scheduler.get_last_lr()
    rec["scheduler_state"] = scheduler.state_dict()
    rec["optimizer_lrs"] = [g["lr"] for g in optimizer.param_groups]
    rec["accessors"] = {
        "module_is_model": engine.module is model, "global_rank": engine.global_rank,
        "world_size": engine.world_size, "dp_world_size": engine.dp_world_size,
        "local_rank": engine.local_rank, "device": str(engine.device),
        "zero_optimization_stage": engine.zero_optimization_stage(),
        "bfloat16_enabled": engine.bfloat16_enabled(), "fp16_enabled": engine.fp16_enabled(),
        "zero_cpu_offload": engine.zero_cpu_offload(),
        "gradient_clipping": engine.gradient_clipping(),
        "steps_per_print": engine.steps_per_print(),
        "zero_allow_untested_optimizer": engine.zero_allow_untested_optimizer(),
        "optimizer_name": engine.optimizer_name(), "scheduler_name": engine.scheduler_name()}
    rec["checksum"] = checksum(engine)
    return rec


def _stage(stage):
    def scenario(tmp):
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, gas=2, clip=1.0,
                                                        optimizer=adamw()))
        return {"steps": train(engine, batches(6, 2)), "checksum": checksum(engine)}
    scenario.__name__ = f"stage{stage}_fp32"
    scenario.__doc__ = f"Stage {stage}, fp32, AdamW from the config, accumulation 2, clip 1.0."
    return scenario


def client_optimizer_and_scheduler(tmp):
    """Stage 2; the program's AdamW with a no-decay group and its LambdaLR, both passed in."""
    model = mlp()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith("weight")
                                                                and p.dim() > 1)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=opt,
                                                           lr_scheduler=sched,
                                                           config=config(2, clip=1.0))
    rec = {"same_scheduler": scheduler is sched, "steps": train(engine, batches(4, 2))}
    rec["scheduler_last_lr"] = scheduler.get_last_lr()
    rec["group_lrs"] = [g["lr"] for g in optimizer.param_groups]
    rec["group_wd"] = [g["weight_decay"] for g in optimizer.param_groups]
    rec["checksum"] = checksum(engine)
    return rec


def client_optimizer_config_scheduler(tmp):
    """Stage 3; the program's SGD (momentum, allowed as an untested ZeRO optimizer) with
    WarmupLR from the config."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cfg = config(3, clip=0.0, zero_allow_untested_optimizer=True,
                 scheduler={"type": "WarmupLR", "params": {
                     "warmup_min_lr": 0.0, "warmup_max_lr": 0.02, "warmup_num_steps": 4,
                     "warmup_type": "linear"}})
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=opt,
                                                           config=cfg)
    rec = {"lr_before": engine.get_lr(), "steps": train(engine, batches(5, 2))}
    rec["scheduler_last_lr"] = scheduler.get_last_lr()
    rec["checksum"] = checksum(engine)
    return rec


def client_sgd_not_allowed(tmp):
    """A ZeRO stage with an optimizer DeepSpeed has not tested, without
    zero_allow_untested_optimizer: initialize refuses it."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    deepspeed.initialize(model=model, optimizer=opt, config=config(2))
    return {"initialized": True}


def offload_client_optimizer_refused(tmp):
    """offload_optimizer cpu with the program's torch AdamW: DeepSpeed refuses it (not
    DeepSpeedCPUAdam) unless zero_force_ds_cpu_optimizer is false."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    deepspeed.initialize(model=model, optimizer=opt, config=config(
        2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}))
    return {"initialized": True}


def offload_client_optimizer_allowed(tmp):
    """The same with "zero_force_ds_cpu_optimizer": false: the torch AdamW on the host."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config(
        3, clip=1.0, zero_force_ds_cpu_optimizer=False,
        zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}}))
    return {"offload": engine.zero_cpu_offload(), "steps": train(engine, batches(3, 2)),
            "checksum": checksum(engine)}


class PerTensorNormalizedSGD(torch.optim.Optimizer):
    """A shape-aware update: each parameter moves by lr * g / ||g|| (its own whole norm)."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad / (p.grad.norm() + 1e-12), alpha=-group["lr"])


def stage0_per_tensor_optimizer(tmp):
    """Stage 0 with an optimizer that reads each parameter's whole norm."""
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model,
                                      optimizer=PerTensorNormalizedSGD(model.parameters(), 0.05),
                                      config=config(0))
    return {"steps": train(engine, batches(3, 2)), "checksum": checksum(engine)}


def _bf16(stage):
    def scenario(tmp):
        model = mlp()
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3, wd=0.5, kind="Adam"),
                     bf16={"enabled": True})
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        rec = {"param_dtypes": sorted({str(p.dtype) for p in engine.module.parameters()})}
        rec["steps"] = train(engine, batches(8, 2), cast=torch.bfloat16)
        rec["checksum"] = checksum(engine)
        return rec
    scenario.__name__ = f"bf16_stage{stage}_adam"
    scenario.__doc__ = (f"Stage {stage} in bf16, \"Adam\" from the config (AdamW by DeepSpeed's "
                        "adam_w_mode default).")
    return scenario


def adam_l2_mode(tmp):
    """Stage 1, "Adam" with adam_w_mode false: L2 weight decay, not decoupled."""
    model = mlp()
    opt = adamw(lr=3e-3, wd=0.5, kind="Adam")
    opt["params"]["adam_w_mode"] = False
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(1, optimizer=opt))
    return {"steps": train(engine, batches(3, 2)), "checksum": checksum(engine)}


def checkpoint_roundtrip(tmp):
    """Stage 3 with a scheduler: save after 2 steps (client_state), train 2 more; a fresh
    engine from other weights loads the save and must train the same 2 steps."""
    ckpt = os.path.join(tmp, "ckpt")
    cfg = config(3, clip=1.0, optimizer=adamw(), scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 3}})
    data = batches(4, 2)
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    train(engine, data[:2])
    saved = engine.save_checkpoint(ckpt, client_state={"epoch": 7, "note": "mine"})
    dist.barrier()
    rec = {"save_returned": saved if isinstance(saved, (bool, type(None))) else str(saved),
           "files": sorted(os.listdir(ckpt))}
    with open(os.path.join(ckpt, "latest")) as f:
        rec["latest"] = f.read()
    rec["after_save"] = train(engine, data[2:])
    del engine
    gc.collect()

    model = mlp(seed=5)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    path, client_state = engine.load_checkpoint(ckpt)
    # The file differs by format (DeepSpeed: this rank's model states .pt); its folder not.
    rec["load_path"] = [os.path.relpath(os.path.dirname(path), ckpt), os.path.isfile(path)]
    rec["client_state_keys"] = sorted(client_state)
    rec["client_state_values"] = {k: client_state[k] for k in ("epoch", "note")
                                  if k in client_state}
    rec["counters_after_load"] = counters(engine)
    rec["lr_after_load"] = engine.get_lr()
    rec["after_load"] = train(engine, data[2:])
    missing, missing_state = engine.load_checkpoint(os.path.join(tmp, "nothing-here"))
    rec["load_missing"] = [missing, missing_state]
    return rec


def save_16bit_model_files(tmp):
    """save_16bit_model with its default name at stage 3 (gather key on, and off: nothing)
    and at stage 2: the files, and the state dict read back with torch.load."""
    rec = {}
    for stage, gather in ((3, True), (3, False), (2, None)):
        out = os.path.join(tmp, f"stage{stage}_{gather}")
        zero = {"stage": stage}
        if gather is not None:
            zero["stage3_gather_16bit_weights_on_model_save"] = gather
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, optimizer=adamw(),
                                                        zero_optimization=zero))
        train(engine, batches(2, 2))
        saved = engine.save_16bit_model(out)
        dist.barrier()
        files = sorted(os.listdir(out)) if os.path.isdir(out) else []
        row = {"returned": saved, "files": files}
        if "pytorch_model.bin" in files:
            sd = torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True)
            row["tensors"] = {k: [str(v.dtype), list(v.shape), float(v.double().sum())]
                              for k, v in sd.items()}
        rec[f"stage{stage}_gather_{gather}"] = row
        del engine
        gc.collect()
    return rec


SCHEDULES = {
    "WarmupLR_log": {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-4, "warmup_max_lr": 1e-2, "warmup_num_steps": 5}},
    "WarmupDecayLR_past_total": {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 3,
        "total_num_steps": 8, "warmup_type": "linear"}},
    "WarmupCosineLR": {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 10, "warmup_num_steps": 3, "warmup_min_ratio": 0.1,
        "cos_min_ratio": 0.01, "warmup_type": "log"}},
    "OneCycle": {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 3,
        "cycle_second_step_size": 2, "decay_step_size": 2, "decay_lr_rate": 0.5,
        "cycle_momentum": True, "cycle_min_mom": 0.8, "cycle_max_mom": 0.9,
        "decay_mom_rate": 0.1}},
    "LRRangeTest": {"type": "LRRangeTest", "params": {
        "lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 2,
        "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": True}},
}


def lr_schedules(tmp):
    """DeepSpeed's config schedulers over 11 steps: lr and momentum as the engine reports
    them after each step, and the losses they give (stage 1, AdamW from the config)."""
    rec = {}
    for name, sched in SCHEDULES.items():
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(1, optimizer=adamw(), scheduler=sched))
        rows = train(engine, batches(11, 2))
        rec[name] = {"lr": [r["lr"] for r in rows], "losses": [r["loss"] for r in rows],
                     "mom": engine.get_mom()}
        rec[name]["state"] = engine.lr_scheduler.state_dict()
        del engine
        gc.collect()
    return rec


def full_tensor_accessors(tmp):
    """deepspeed.utils.safe_get_full_grad between backward and step, safe_get_full_fp32_param
    and safe_get_full_optimizer_state after it, safe_set_full_fp32_param then a step (stage 3
    and 2)."""
    from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad,
                                 safe_get_full_optimizer_state, safe_set_full_fp32_param)

    rec = {}
    for stage in (3, 2):
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, clip=1.0, optimizer=adamw()))
        (x, y), (x2, y2), (x3, y3) = batches(3, 2)
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        params = list(engine.module.named_parameters())
        grads = {n: float(safe_get_full_grad(p).double().sum()) for n, p in params}
        engine.step()
        loss = F.mse_loss(engine(x2), y2)
        engine.backward(loss)
        engine.step()
        row = {"grads": grads,
               "fp32": {n: float(safe_get_full_fp32_param(p).double().sum()) for n, p in params},
               "exp_avg_sq": {n: float(safe_get_full_optimizer_state(p, "exp_avg_sq").double()
                                       .sum()) for n, p in params}}
        first = params[0][1]
        safe_set_full_fp32_param(first, torch.full(tuple(first.ds_shape if stage == 3 else
                                                         first.shape), 0.02))
        row["after_set"] = float(safe_get_full_fp32_param(first).double().sum())
        row["loss_after_set"] = train(engine, [(x3, y3)])[0]["loss"]
        rec[f"stage{stage}"] = row
        del engine
        gc.collect()
    return rec


def gathered_write_without_modifier(tmp):
    """Stage 3, nothing persistent: a write under GatheredParameters(modifier_rank=None) on
    every rank (DeepSpeed-Chat's EMA), then the gathered value and a step."""
    cfg = config(3, optimizer=adamw(), zero_optimization={
        "stage": 3, "stage3_param_persistence_threshold": 0})
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    weight = engine.module[3].weight
    with deepspeed.zero.GatheredParameters([weight]):
        before = float(weight.detach().double().sum())
        weight.data.mul_(0.5)
        inside = float(weight.detach().double().sum())
    with deepspeed.zero.GatheredParameters([weight]):
        after = float(weight.detach().double().sum())
    return {"sums": [before, inside, after], "steps": train(engine, batches(2, 2))}


def no_sync_and_manual_boundary(tmp):
    """Stage 1: the first of two micro-batches under engine.no_sync(); then stage 2 driven by
    set_gradient_accumulation_boundary."""
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(1, gas=2, optimizer=adamw()))
    rows = []
    for i, (x, y) in enumerate(batches(6, 2)):
        if i % 2 == 0:  # forward and backward without the reduction; step() outside
            with engine.no_sync():
                loss = F.mse_loss(engine(x), y)
                engine.backward(loss)
            engine.step()
            rows.append({"loss": float(loss.item()), **counters(engine)})
        else:
            rows += train(engine, [(x, y)])
    rec = {"no_sync": rows, "no_sync_checksum": checksum(engine)}
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(2, gas=2, optimizer=adamw()))
    rows = []
    for i, (x, y) in enumerate(batches(6, 2)):
        engine.set_gradient_accumulation_boundary(i % 2 == 1)
        rows += train(engine, [(x, y)])
    rec["manual"] = rows
    rec["manual_checksum"] = checksum(engine)
    return rec


class TiedNet(nn.Module):
    """An embedding shared with the output layer, a frozen layer, dropout and a BatchNorm
    (running statistics are buffers each rank updates from its own data)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, IN)
        self.frozen = nn.Linear(IN, IN)
        self.frozen.requires_grad_(False)
        # No bias before the BatchNorm: its gradient is zero up to rounding (the norm removes
        # it), so Adam would turn rounding noise into lr-sized steps that differ by engine.
        self.body = nn.Sequential(nn.Linear(IN, HIDDEN, bias=False), nn.BatchNorm1d(HIDDEN),
                                  nn.GELU(), nn.Dropout(0.3), nn.Linear(HIDDEN, IN))

    def forward(self, ids):
        h = self.body(self.frozen(self.emb(ids)))
        return h @ self.emb.weight.t()


def token_batches(n, micro, seed=2):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 12, (micro * world,), generator=g)
        out.append((ids[rank * micro:(rank + 1) * micro], (ids[rank * micro:(rank + 1) * micro]
                                                          + 1) % 12))
    return out


def tied_frozen_dropout_batchnorm(tmp):
    """Stage 3 and 2: tied weights, a frozen layer, dropout (the global RNG, seeded the same
    on every rank before initialize) and BatchNorm buffers; the 16-bit file's names."""
    rec = {}
    for stage in (3, 2):
        torch.manual_seed(0)
        model = TiedNet()
        zero = {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}
        if stage == 3:
            zero["stage3_param_persistence_threshold"] = 0
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=config(stage, clip=1.0, optimizer=adamw(), zero_optimization=zero))
        torch.manual_seed(100 + dist.get_rank())  # dropout masks differ per rank, as usual
        losses = []
        for ids, target in token_batches(4, 3):
            loss = F.cross_entropy(engine(ids), target)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.item()))
        bn = engine.module.body[1]
        row = {"losses": losses, "running_mean": float(bn.running_mean.double().sum()),
               "num_batches_tracked": int(bn.num_batches_tracked),
               "frozen_grad_is_none": engine.module.frozen.weight.grad is None}
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params):
            row["frozen_sum"] = float(engine.module.frozen.weight.double().sum())
            row["emb_sum"] = float(engine.module.emb.weight.double().sum())
        out = os.path.join(tmp, f"stage{stage}")
        engine.save_16bit_model(out)
        dist.barrier()
        sd = torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True)
        row["saved_keys"] = sorted(sd)
        row["saved_running_mean"] = float(sd["body.1.running_mean"].double().sum())
        rec[f"stage{stage}"] = row
        del engine
        gc.collect()
    return rec


def param_groups_with_own_lr(tmp):
    """model_parameters as two groups with their own lr and weight decay, the optimizer and
    WarmupDecayLR from the config: what each group's lr becomes, step by step."""
    model = mlp()
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    groups = [{"params": first, "lr": 1e-2, "weight_decay": 0.0},
              {"params": rest, "lr": 1e-3}]
    engine, optimizer, *_ = deepspeed.initialize(
        model=model, model_parameters=groups, config=config(
            3, optimizer=adamw(lr=5e-3), scheduler={"type": "WarmupDecayLR", "params": {
                "warmup_min_lr": 0.0, "warmup_max_lr": 2e-3, "warmup_num_steps": 2,
                "total_num_steps": 6}}))
    rows = train(engine, batches(4, 2))
    return {"steps": rows, "group_lrs": [g["lr"] for g in optimizer.param_groups],
            "group_wd": [g["weight_decay"] for g in optimizer.param_groups],
            "checksum": checksum(engine)}


def gradient_scaling_options(tmp):
    """prescale_gradients, then gradient_predivide_factor 4 (stages 0 and 1: DeepSpeed
    refuses both with the reduce-scatter of stages 2 and 3), then bf16 gradient
    communication while training in fp32 (stages 2 and 3)."""
    rec = {}
    for name, extra, stages in (("prescale", {"prescale_gradients": True}, (0, 1)),
                                ("predivide", {"gradient_predivide_factor": 4.0}, (0, 1)),
                                ("bf16_comm", {"communication_data_type": "bf16"}, (2, 3))):
        for stage in stages:
            model = mlp()
            engine, *_ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(),
                config=config(stage, gas=2, clip=1.0, optimizer=adamw(), **extra))
            rows = train(engine, batches(4, 2))
            rec[f"{name}_stage{stage}"] = {"losses": [r["loss"] for r in rows],
                                           "grad_norms": [r["grad_norm"] for r in rows]}
            del engine
            gc.collect()
    return rec


def module_state_outside_gather(tmp):
    """Stage 3: what engine.module.state_dict() and a parameter hold outside a gather."""
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(3, optimizer=adamw(), zero_optimization={
                                          "stage": 3, "stage3_param_persistence_threshold": 0}))
    train(engine, batches(1, 2))
    sd = engine.module.state_dict()
    return {"state_dict": {k: [list(v.shape), str(v.dtype)] for k, v in sd.items()},
            "param_shape": list(engine.module[0].weight.shape),
            "ds_status": str(engine.module[0].weight.ds_status)}


def zero_init_variants(tmp):
    """zero.Init switched off, with remote_device="cpu", and with bf16 in its config (the
    parameters' dtype and attributes), each then trained 2 steps at stage 3 in that dtype."""
    rec = {}
    bf16 = {"enabled": True}
    for name, kwargs, extra in (("disabled", {"enabled": False}, {}),
                                ("remote_cpu", {"remote_device": "cpu"}, {}),
                                ("bf16", {}, {"bf16": bf16})):
        cfg = config(3, optimizer=adamw(), zero_optimization={
            "stage": 3, "stage3_param_persistence_threshold": 0}, **extra)
        torch.manual_seed(0)
        with deepspeed.zero.Init(config_dict_or_path=cfg, **kwargs):
            model = mlp()
        row = {"dtypes": sorted({str(p.dtype) for p in model.parameters()}),
               "partitioned": [hasattr(p, "ds_id") for p in model.parameters()],
               "shapes": [list(p.shape) for p in model.parameters()]}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        row["steps"] = [r["loss"] for r in train(engine, batches(2, 2),
                                                 cast=torch.bfloat16 if extra else None)]
        row["checksum"] = checksum(engine)
        rec[name] = row
        del engine
        gc.collect()
    return rec


def checkpoint_options(tmp):
    """Stage 2 with a frozen layer: save_checkpoint(tag, save_latest=False,
    exclude_frozen_parameters=True), load by tag into an engine with other weights (the frozen
    layer keeps its own), and load_module_only (counters and optimizer state start over)."""
    ckpt = os.path.join(tmp, "ckpt")

    def build(seed):
        torch.manual_seed(seed)
        model = mlp(seed)
        model[0].requires_grad_(False)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=config(2, optimizer=adamw()))
        return engine

    engine = build(0)
    data = batches(4, 2)
    train(engine, data[:2])
    engine.save_checkpoint(ckpt, tag="mine", save_latest=False,
                           exclude_frozen_parameters=True)
    dist.barrier()
    rec = {"files": sorted(os.listdir(ckpt)), "after_save": train(engine, data[2:])}
    del engine
    gc.collect()
    engine = build(5)
    frozen_before = float(engine.module[0].weight.double().sum())
    path, client_state = engine.load_checkpoint(ckpt, tag="mine", load_module_strict=False)
    rec["frozen_kept"] = float(engine.module[0].weight.double().sum()) == frozen_before
    rec["after_load"] = train(engine, data[2:])
    del engine
    gc.collect()
    engine = build(5)
    _, client_state = engine.load_checkpoint(ckpt, tag="mine", load_module_strict=False,
                                             load_module_only=True)
    rec["module_only_counters"] = counters(engine)
    rec["module_only_keys"] = sorted(k for k in client_state
                                     if k in ("global_steps", "skipped_steps",
                                              "dp_world_size", "mp_world_size"))
    rec["module_only_steps"] = train(engine, data[2:])
    return rec


class CheckpointedNet(nn.Module):
    """Hidden blocks under deepspeed.checkpointing.checkpoint (recomputed in backward)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, HIDDEN)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
                                    for _ in range(3))
        self.out = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = deepspeed.checkpointing.checkpoint(block, h)
        return self.out(h)


def activation_checkpointing_and_config_forms(tmp):
    """deepspeed.checkpointing.checkpoint inside the model at stage 3 (configured from the
    config's activation_checkpointing block); then the config given as a JSON path, as
    args.deepspeed_config and as config_params: the sizes each gives."""
    cfg = config(3, gas=2, clip=1.0, optimizer=adamw(), activation_checkpointing={
        "partition_activations": False, "contiguous_memory_optimization": False})
    deepspeed.checkpointing.configure(None, deepspeed_config=cfg)
    torch.manual_seed(0)
    model = CheckpointedNet()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    rec = {"steps": [r["loss"] for r in train(engine, batches(4, 2))],
           "checksum": checksum(engine)}
    del engine
    gc.collect()
    path = os.path.join(tmp, "ds.json")
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump({"train_batch_size": 8, "gradient_accumulation_steps": 2,
                       "optimizer": adamw(), "zero_optimization": {"stage": 2}}, f)
    dist.barrier()
    forms = {"path": {"config": path},
             "args": {"args": argparse.Namespace(deepspeed_config=path,
                                                 local_rank=int(os.environ["LOCAL_RANK"]))},
             "config_params": {"config_params": json.load(open(path))}}
    for name, kwargs in forms.items():
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          **kwargs)
        rec[name] = [engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                     engine.gradient_accumulation_steps(), engine.zero_optimization_stage()]
        del engine
        gc.collect()
    return rec


def dataloader_order(tmp):
    """initialize(training_data=...): the loader's batches on this rank, two epochs."""
    data = torch.utils.data.TensorDataset(torch.arange(22).float().unsqueeze(1))
    model = mlp()
    engine, _, loader, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=data,
        config=config(2, micro=3, optimizer=adamw()))
    epochs = [[b[0].view(-1).long().tolist() for b in loader] for _ in range(2)]
    return {"len": len(loader), "epochs": epochs}


def zero_init_and_gather(tmp):
    """Build under zero.Init, overwrite a weight under GatheredParameters(modifier_rank=0),
    train 2 steps; the partitioned parameters' DeepSpeed attributes."""
    cfg = config(3, optimizer=adamw(), zero_optimization={
        "stage": 3, "stage3_param_persistence_threshold": 0})
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = mlp()
    first = model[0].weight
    rec = {"attrs": [[p.ds_numel, list(p.ds_shape), p.ds_tensor.numel(), list(p.shape)]
                     for p in model.parameters()]}
    with deepspeed.zero.GatheredParameters(first, modifier_rank=0):
        if dist.get_rank() == 0:
            first.data.fill_(0.01)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    rec["steps"] = train(engine, batches(2, 2))
    rec["checksum"] = checksum(engine)
    return rec


def eval_mode_forward(tmp):
    """engine.eval() / train() flags and a no-grad forward at stage 3."""
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(3, optimizer=adamw()))
    x, _ = batches(1, 2)[0]
    engine.eval()
    rec = {"eval_flags": [engine.training, engine.module.training]}
    with torch.no_grad():
        rec["eval_out_sum"] = float(engine(x).double().sum())
    engine.train()
    rec["train_flags"] = [engine.training, engine.module.training]
    return rec


def batch_size_arithmetic(tmp):
    """train_batch_size alone (micro derived) and set_train_batch_size changing the
    accumulation steps."""
    model = mlp()
    cfg = {"train_batch_size": 8, "gradient_accumulation_steps": 2, "optimizer": adamw(),
           "zero_optimization": {"stage": 1}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=cfg)
    rec = {"sizes": [engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                     engine.gradient_accumulation_steps()]}
    engine.set_train_batch_size(16)
    rec["sizes_after_set"] = [engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                              engine.gradient_accumulation_steps()]
    rec["steps"] = train(engine, batches(8, 2))
    return rec


def config_torch_optimizers_by_name(tmp):
    """optimizer.type naming a torch.optim class DeepSpeed has no own build for (RMSprop,
    Adamax; DeepSpeed looks the name up in torch.optim), and Adagrad (torch's at stages 1-3
    without offload). RMSprop and Adamax are untested ZeRO optimizers: allowed by the key,
    refused without it."""
    rec = {}
    cases = {"RMSprop_stage2": (2, {"type": "RMSprop", "params": {
                 "lr": 3e-3, "alpha": 0.95, "momentum": 0.5, "weight_decay": 0.01}}, True),
             "Adamax_stage3": (3, {"type": "Adamax", "params": {
                 "lr": 4e-3, "betas": [0.8, 0.95], "weight_decay": 0.02}}, True),
             "Adagrad_stage2": (2, {"type": "Adagrad", "params": {
                 "lr": 5e-2, "lr_decay": 0.01, "initial_accumulator_value": 0.1}}, False),
             "RMSprop_not_allowed": (1, {"type": "RMSprop", "params": {"lr": 1e-3}}, False)}
    for name, (stage, opt, allow) in cases.items():
        model = mlp()
        extra = {"zero_allow_untested_optimizer": True} if allow else {}
        try:
            engine, *_ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(),
                config=config(stage, gas=2, clip=1.0, optimizer=opt, **extra))
        except Exception as exc:
            rec[name] = {"error": type(exc).__name__}
            continue
        rec[name] = {"steps": train(engine, batches(6, 2)), "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def program_moves_the_lr(tmp):
    """Stage 3 with the program's AdamW and a StepLR the program built over it but did not
    pass to initialize (it steps it after each engine.step()); then the program sets the lr
    of the optimizer initialize returned by hand, and last of the one it built."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.1)
    own = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=opt,
                                                           config=config(3, clip=1.0))
    data = batches(7, 2)
    rec = {"returned_scheduler": scheduler is not None, "steps": []}
    for batch in data[:4]:
        rec["steps"] += train(engine, [batch])
        own.step()
    for group in optimizer.param_groups:
        group["lr"] = 1e-2
    rec["steps"] += train(engine, data[4:6])
    for group in opt.param_groups:
        group["lr"] = 2e-4
    rec["steps"] += train(engine, data[6:])
    rec["scheduler_last_lr"] = own.get_last_lr()
    rec["checksum"] = checksum(engine)
    return rec


def frozen_reference_engine(tmp):
    """Two engines in one program, as RLHF trainers run them: a reference model initialized
    without an optimizer at stage 3 (forward only, in eval mode) and a policy at stage 3
    trained on its own loss plus a penalty for leaving the reference's outputs."""
    reference = mlp(seed=3)
    ref_engine, ref_opt, _, ref_sched = deepspeed.initialize(model=reference,
                                                             config=config(3))
    ref_engine.eval()
    policy = mlp()
    engine, *_ = deepspeed.initialize(model=policy, model_parameters=policy.parameters(),
                                      config=config(3, gas=2, clip=1.0, optimizer=adamw()))
    rec = {"reference_returns": [ref_opt is None, ref_sched is None],
           "reference_training": [ref_engine.training, ref_engine.module.training],
           "steps": []}
    for x, y in batches(6, 2):
        with torch.no_grad():
            anchor = ref_engine(x)
        out = engine(x)
        loss = F.mse_loss(out, y) + 0.5 * F.mse_loss(out, anchor)
        engine.backward(loss)
        engine.step()
        rec["steps"].append({"loss": float(loss.item()), "anchor": float(anchor.double().sum()),
                             "grad_norm": number(engine.get_global_grad_norm()),
                             **counters(engine)})
    rec["reference_counters"] = counters(ref_engine)
    rec["checksum"] = checksum(engine)
    rec["reference_checksum"] = checksum(ref_engine)
    return rec


def load_without_optimizer_or_scheduler(tmp):
    """Stages 2 and 3 with WarmupLR: save after 2 steps; a fresh engine from other weights
    loads with load_optimizer_states=False and load_lr_scheduler_states=False (the weights
    and counters come back, the moments and the schedule start over) and trains 2 steps."""
    rec = {}
    for stage in (2, 3):
        ckpt = os.path.join(tmp, f"ckpt{stage}")
        cfg = config(stage, optimizer=adamw(lr=2e-3), scheduler={
            "type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3,
                                           "warmup_num_steps": 4}})
        data = batches(4, 2)
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        train(engine, data[:2])
        engine.save_checkpoint(ckpt)
        dist.barrier()
        del engine
        gc.collect()
        model = mlp(seed=5)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        engine.load_checkpoint(ckpt, load_optimizer_states=False,
                               load_lr_scheduler_states=False)
        rec[f"stage{stage}"] = {"counters": counters(engine), "lr": engine.get_lr(),
                                "checksum_after_load": checksum(engine),
                                "steps": train(engine, data[2:]),
                                "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def offload_with_config_optimizer(tmp):
    """offload_optimizer cpu with "AdamW" from the config and torch_adam (torch's AdamW on
    the host, no op to build) at stage 2, and at stage 3 with offload_param cpu as well."""
    rec = {}
    for stage, zero in ((2, {"offload_optimizer": {"device": "cpu"}}),
                        (3, {"offload_optimizer": {"device": "cpu"},
                             "offload_param": {"device": "cpu"}})):
        model = mlp()
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(),
            config=config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3),
                          zero_optimization={"stage": stage, **zero}))
        rec[f"stage{stage}"] = {"offload": engine.zero_cpu_offload(),
                                "steps": train(engine, batches(6, 2)),
                                "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def bf16_fp32_gradient_accumulation(tmp):
    """bf16 with data_types.grad_accum_dtype fp32 at stages 1 and 2, accumulation 4."""
    rec = {}
    for stage in (1, 2):
        model = mlp()
        cfg = config(stage, gas=4, clip=1.0, optimizer=adamw(lr=3e-3),
                     bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"})
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        rec[f"stage{stage}"] = {"steps": train(engine, batches(8, 2), cast=torch.bfloat16),
                                "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def backward_options(tmp):
    """engine.backward(loss, scale_wrt_gas=False) with accumulation 2 (the program scales the
    loss itself); two backward calls per micro-step: at stage 3 from two forwards, at stage 2
    on one graph with retain_graph=True, and at stage 2 with accumulation 1 marking only the
    last backward as the boundary (set_gradient_accumulation_boundary)."""
    def build(stage, gas):
        model = mlp()
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(),
            config=config(stage, gas=gas, clip=1.0, optimizer=adamw()))
        return engine

    def row(engine, loss, **extra):
        return {"loss": float(loss.item()), "grad_norm": number(engine.get_global_grad_norm()),
                **extra, **counters(engine)}

    rec = {}
    engine, rows = build(2, 2), []
    for x, y in batches(4, 2):
        loss = F.mse_loss(engine(x), y)
        returned = engine.backward(loss / 4, scale_wrt_gas=False)
        engine.step()
        rows.append(row(engine, loss, returned=number(returned)))
    rec["unscaled"] = {"steps": rows, "checksum": checksum(engine)}
    del engine
    gc.collect()
    for name, stage, gas in (("two_forwards_stage3", 3, 2), ("retained_stage2", 2, 2),
                             ("manual_boundary_stage2", 2, 1)):
        engine, rows = build(stage, gas), []
        for x, y in batches(4, 2):
            if name == "manual_boundary_stage2":
                engine.set_gradient_accumulation_boundary(False)
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss, retain_graph=name == "retained_stage2")
            if name == "manual_boundary_stage2":
                engine.set_gradient_accumulation_boundary(True)
            second = loss if name == "retained_stage2" else F.mse_loss(engine(x * 0.5), y)
            engine.backward(second)
            engine.step()
            rows.append(row(engine, loss))
        rec[name] = {"steps": rows, "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def dataloader_options(tmp):
    """initialize(training_data=, collate_fn=) with "dataloader_drop_last": true, and
    engine.deepspeed_io with its own batch size."""
    data = torch.utils.data.TensorDataset(torch.arange(23).float().unsqueeze(1))

    def collate(items):
        return torch.stack([item[0] for item in items]) * 10

    model = mlp()
    engine, _, loader, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=data,
        collate_fn=collate, config=config(2, micro=3, optimizer=adamw(),
                                          dataloader_drop_last=True))
    rec = {"len": len(loader), "epochs": [[b.view(-1).long().tolist() for b in loader]
                                          for _ in range(2)]}
    own = engine.deepspeed_io(data, batch_size=4, pin_memory=False)
    rec["io_len"] = len(own)
    rec["io_batches"] = [b.view(-1).long().tolist() for b in own]
    return rec


def zero_communication_flags(tmp):
    """Stage 2 with DeepSpeed's communication switches away from their defaults
    (reduce_scatter and allgather_partitions off, overlap_comm, contiguous_gradients,
    round_robin_gradients, small buckets): the numbers do not change."""
    model = mlp()
    zero = {"stage": 2, "reduce_scatter": False, "allgather_partitions": False,
            "overlap_comm": True, "contiguous_gradients": True, "round_robin_gradients": True,
            "reduce_bucket_size": 64, "allgather_bucket_size": 64}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(2, gas=2, clip=1.0, optimizer=adamw(),
                                                    zero_optimization=zero))
    return {"steps": train(engine, batches(6, 2)), "checksum": checksum(engine)}


def program_built_deepspeed_schedules(tmp):
    """DeepSpeed's schedule classes built by the program (deepspeed.runtime.lr_schedules) over
    its own optimizer and passed as lr_scheduler: WarmupDecayLR over AdamW at stage 2, OneCycle
    with momentum over SGD at stage 1."""
    from deepspeed.runtime.lr_schedules import OneCycle, WarmupDecayLR

    rec = {}
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.1)
    sched = WarmupDecayLR(opt, total_num_steps=6, warmup_min_lr=1e-4, warmup_max_lr=2e-3,
                          warmup_num_steps=2, warmup_type="linear")
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=opt,
                                                   lr_scheduler=sched, config=config(2))
    rec["warmup_decay"] = {"same": scheduler is sched, "steps": train(engine, batches(5, 2)),
                           "state": scheduler.state_dict(), "last": scheduler.get_last_lr()}
    del engine
    gc.collect()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = OneCycle(opt, cycle_min_lr=0.01, cycle_max_lr=0.05, cycle_first_step_size=2,
                     cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9)
    engine, _, _, scheduler = deepspeed.initialize(
        model=model, optimizer=opt, lr_scheduler=sched,
        config=config(1, zero_allow_untested_optimizer=True))
    rec["one_cycle"] = {"steps": train(engine, batches(5, 2)), "state": scheduler.state_dict(),
                        "checksum": checksum(engine)}
    return rec


def comm_surface(tmp):
    """deepspeed.comm as programs call it: ranks and sizes, all_reduce, broadcast,
    all_gather_into_tensor, all_gather, a barrier."""
    import deepspeed.comm as ds_dist

    rank = ds_dist.get_rank()
    rec = {"is_initialized": ds_dist.is_initialized(), "rank": rank,
           "world": ds_dist.get_world_size(), "local_rank": ds_dist.get_local_rank()}
    t = torch.tensor([float(rank + 1), 10.0])
    ds_dist.all_reduce(t)
    rec["all_reduce"] = t.tolist()
    m = torch.tensor([float(rank + 3)])
    ds_dist.all_reduce(m, op=ds_dist.ReduceOp.MAX)
    rec["all_reduce_max"] = m.tolist()
    b = torch.tensor([float(rank * 7)])
    ds_dist.broadcast(b, src=1)
    rec["broadcast"] = b.tolist()
    out = torch.zeros(2 * ds_dist.get_world_size())
    ds_dist.all_gather_into_tensor(out, torch.tensor([float(rank), float(-rank)]))
    rec["all_gather_into_tensor"] = out.tolist()
    parts = [torch.zeros(1) for _ in range(ds_dist.get_world_size())]
    ds_dist.all_gather(parts, torch.tensor([float(rank * 2)]))
    rec["all_gather"] = [p.tolist() for p in parts]
    ds_dist.barrier()
    return rec


def argument_parser(tmp):
    """deepspeed.add_config_arguments: the options it adds and what they parse to."""
    import argparse

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    return {"defaults": vars(parser.parse_args([])),
            "given": vars(parser.parse_args(["--deepspeed", "--deepspeed_config", "c.json"]))}


def optimizer_state_write(tmp):
    """safe_set_full_optimizer_state on the first weight's exp_avg after a step, then another
    step: the write must steer it (stages 3 and 1)."""
    from deepspeed.utils import safe_get_full_optimizer_state, safe_set_full_optimizer_state

    rec = {}
    for stage in (3, 1):
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, optimizer=adamw(lr=1e-2)))
        data = batches(3, 2)
        train(engine, data[:1])
        first = next(engine.module.parameters())
        shape = tuple(first.ds_shape) if stage == 3 else tuple(first.shape)
        safe_set_full_optimizer_state(first, torch.full(shape, 0.05), "exp_avg")
        row = {"read_back": float(safe_get_full_optimizer_state(first, "exp_avg").double().sum()),
               "steps": train(engine, data[1:]), "checksum": checksum(engine)}
        rec[f"stage{stage}"] = row
        del engine
        gc.collect()
    return rec


def zero_init_dtype_and_disabled_gather(tmp):
    """zero.Init(dtype=torch.float32) under a bf16 config (the explicit dtype wins), and
    GatheredParameters(enabled=False), which gathers nothing."""
    cfg = config(3, optimizer=adamw(), bf16={"enabled": True}, zero_optimization={
        "stage": 3, "stage3_param_persistence_threshold": 0})
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg, dtype=torch.float32):
        model = mlp()
    rec = {"dtypes": sorted({str(p.dtype) for p in model.parameters()})}
    with deepspeed.zero.GatheredParameters(list(model.parameters()), enabled=False):
        rec["numel_disabled"] = sum(p.numel() for p in model.parameters())
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        rec["numel_enabled"] = sum(p.numel() for p in model.parameters())
        rec["sum"] = float(sum(p.double().sum() for p in model.parameters()))
    return rec


def bf16_offload_and_fp32_communication(tmp):
    """bf16 with offload_optimizer cpu ("AdamW", torch_adam) at stage 3, and bf16 with
    "communication_data_type": "fp32" at stage 2 and stage 3."""
    rec = {}
    cases = {"offload_stage3": (3, {"offload_optimizer": {"device": "cpu"}}, {}),
             "fp32_comm_stage2": (2, {}, {"communication_data_type": "fp32"}),
             "fp32_comm_stage3": (3, {}, {"communication_data_type": "fp32"})}
    for name, (stage, zero, extra) in cases.items():
        model = mlp()
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3), bf16={"enabled": True},
                     zero_optimization={"stage": stage, **zero}, **extra)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        rec[name] = {"steps": train(engine, batches(6, 2), cast=torch.bfloat16),
                     "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def residency(engine):
    """Every parameter's (ds_status, numel, ds_persist) as a program sees it now, and the
    total numel (what the HF Trainer's total_flos counts)."""
    params = list(engine.module.named_parameters())
    return {"params": {n: [str(p.ds_status).split(".")[-1], p.numel(),
                           bool(getattr(p, "ds_persist", False))] for n, p in params},
            "numel": sum(p.numel() for _, p in params)}


def param_persistence(tmp):
    """Stage 3 with stage3_param_persistence_threshold 20 (the biases and the norm persist,
    the weights do not): each parameter's status after initialize, forward, backward, step,
    an eval forward, empty_partition_cache, a GatheredParameters of a released persistent
    parameter, save and load; then the default threshold (everything persists here) and a
    stage3_model_persistence_threshold that skips parameters past its budget."""
    ckpt = os.path.join(tmp, "ckpt")
    zero = {"stage": 3, "stage3_param_persistence_threshold": 20}
    model = mlp()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(3, optimizer=adamw(), zero_optimization=zero))
    (x, y), (x2, y2), (x3, y3) = batches(3, 2)
    rec = {"initialized": residency(engine)}
    loss = F.mse_loss(engine(x), y)
    rec["forward"] = residency(engine)
    engine.backward(loss)
    rec["backward"] = residency(engine)
    engine.step()
    rec["step"] = residency(engine)
    rec["losses"] = [float(loss.item())] + [r["loss"] for r in train(engine, [(x2, y2)])]
    engine.eval()
    with torch.no_grad():
        engine(x3)
    engine.train()
    rec["eval_forward"] = residency(engine)
    engine.empty_partition_cache()
    rec["emptied"] = residency(engine)
    bias = engine.module[5].bias
    with deepspeed.zero.GatheredParameters([bias]):
        rec["gathered_sum"] = float(bias.detach().double().sum())
    rec["after_gather"] = residency(engine)
    engine.save_checkpoint(ckpt, tag="t")
    rec["saved"] = residency(engine)
    engine.load_checkpoint(ckpt, tag="t")
    rec["loaded"] = residency(engine)
    rec["losses"] += [r["loss"] for r in train(engine, [(x3, y3)])]
    rec["after_load_step"] = residency(engine)
    del engine
    gc.collect()
    for name, zero in (("default", {"stage": 3}),
                       ("model_budget", {"stage": 3, "stage3_param_persistence_threshold": 20,
                                         "stage3_model_persistence_threshold": 40})):
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(3, optimizer=adamw(),
                                                        zero_optimization=zero))
        rows = train(engine, batches(2, 2))
        rec[name] = {"losses": [r["loss"] for r in rows], "residency": residency(engine)}
        del engine
        gc.collect()
    return rec


def nonfinite_gradient(tmp):
    """A NaN in rank 0's first micro-batch of optimizer step 2 (of 4; accumulation 2, clip 1.0,
    WarmupLR): per stage and precision, whether that step is applied or skipped, what the
    counters, learning rate and grad norm say, and the parameters after."""
    rec = {}
    bf16 = {"bf16": {"enabled": True}}
    cases = {"stage0_fp32": (0, {}, {}), "stage0_bf16": (0, {}, bf16),
             "stage1_fp32": (1, {}, {}), "stage1_bf16": (1, {}, bf16),
             "stage1_bf16_no_check": (1, {}, {"bf16": {"enabled": True,
                                                       "check_grad_overflow": False}}),
             "stage1_bf16_fp32_accumulation": (1, {}, {**bf16, "data_types": {
                 "grad_accum_dtype": "fp32"}}),
             "stage2_fp32": (2, {}, {}), "stage2_bf16": (2, {}, bf16),
             "stage3_fp32": (3, {"stage3_param_persistence_threshold": 0}, {}),
             "stage3_bf16": (3, {"stage3_param_persistence_threshold": 0}, bf16)}
    for name, (stage, zero, extra) in cases.items():
        model = mlp()
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(),
                     scheduler={"type": "WarmupLR", "params": {
                         "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4,
                         "warmup_type": "linear"}},
                     zero_optimization={"stage": stage, **zero}, **extra)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        data = batches(8, 2)
        if dist.get_rank() == 0:
            x, y = data[2]
            x = x.clone()
            x[0, 0] = float("nan")
            data[2] = (x, y)
        cast = torch.bfloat16 if extra.get("bf16") else None
        rec[name] = {"steps": train(engine, data, cast=cast), "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


class BufferNet(nn.Module):
    """The MLP with two float buffers its forward reads in fp32, as a rotary embedding reads
    inv_freq: `offset` (built in fp32) and `keep` (built in bf16, listed for fp32 the way
    transformers models list such buffers)."""

    _keep_in_fp32_modules_strict = ["keep"]

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = mlp()
        self.register_buffer("offset", torch.linspace(0.1, 0.9, OUT) / 3)
        self.register_buffer("keep", (torch.linspace(1.0, 2.0, OUT) / 3).bfloat16())

    def forward(self, x):
        h = self.body(x)
        return (h.float() * (1 + self.offset.float()) + self.keep.float()).to(h.dtype)


def bf16_buffer_dtypes(tmp):
    """bf16: which dtype the model's buffers train in (DeepSpeed >= 0.19 keeps a buffer's own
    dtype and keeps the model's fp32-listed buffers in fp32), by default at stages 0, 2 and 3
    and under zero.Init, with data_types.buffer_dtype, and with keep_in_fp32_modules."""
    rec = {}
    cases = {"stage0": (0, {}), "stage2": (2, {}), "stage3": (3, {}),
             "stage2_buffer_dtype": (2, {"buffer_dtype": "bf16"}),
             "stage2_buffer_dtype_keep": (2, {"buffer_dtype": "bf16",
                                              "keep_in_fp32_modules": ["offset"]}),
             "stage3_zero_init": (3, None)}
    for name, (stage, data_types) in cases.items():
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3), bf16={"enabled": True})
        if data_types:
            cfg["data_types"] = data_types
        engine = initialized(BufferNet, cfg, zero_init=data_types is None)
        rec[name] = {"buffers": {n: str(b.dtype) for n, b in engine.module.named_buffers()},
                     "steps": [r["loss"] for r in train(engine, batches(4, 2),
                                                        cast=torch.bfloat16)]}
        del engine
        gc.collect()
    return rec


def masters_after_bf16_load(tmp):
    """bf16 at stages 1-3: save after 2 steps, load into a new engine (by default, with
    zero_optimization.load_from_fp32_weights false, and with load_module_only), then 2 more
    steps; whether each fp32 master holds a bf16 value after the load (masters rebuilt from
    the 16-bit weights) or the saved fp32 one."""
    from deepspeed.utils import safe_get_full_fp32_param

    rec = {}
    data = batches(8, 2)
    for stage in (1, 2, 3):
        ckpt = os.path.join(tmp, f"ckpt{stage}")
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3), bf16={"enabled": True})
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        train(engine, data[:4], cast=torch.bfloat16)
        engine.save_checkpoint(ckpt, tag="t")
        del engine
        gc.collect()
        for name, flag, module_only in (("default", True, False), ("bit16", False, False),
                                        ("module_only", True, True)):
            cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3),
                         bf16={"enabled": True},
                         zero_optimization={"stage": stage, "load_from_fp32_weights": flag})
            model = mlp(seed=1)
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              config=cfg)
            engine.load_checkpoint(ckpt, tag="t", load_module_only=module_only)
            masters = [safe_get_full_fp32_param(p) for p in engine.module.parameters()]
            rec[f"stage{stage}_{name}"] = {
                "masters_are_bf16_values": all(
                    bool(torch.equal(m, m.bfloat16().float())) for m in masters),
                "steps": [r["loss"] for r in train(engine, data[4:], cast=torch.bfloat16)]}
            del engine
            gc.collect()
    return rec


class SometimesNet(nn.Module):
    """The MLP plus a layer it never uses and a branch it uses on every other call."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = mlp()
        self.spare = nn.Linear(IN, OUT)
        self.branch = nn.Linear(IN, OUT)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.body(x)
        return out + self.branch(x) if self.calls % 2 else out


def unused_parameters(tmp):
    """AdamW (weight decay 0.1), accumulation 2, clip 1.0 at stages 0-3: a layer that never gets
    a gradient and one that gets it in one micro-batch of each step. DeepSpeed's ZeRO
    optimizers treat a missing gradient as zeros (decay and moments still move the layer);
    the torch optimizer at stage 0 skips it."""
    rec = {}
    for stage in (0, 1, 2, 3):
        model = SometimesNet()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, gas=2, clip=1.0,
                                                        optimizer=adamw(wd=0.1)))
        rows = train(engine, batches(6, 2))
        rec[f"stage{stage}"] = {"losses": [r["loss"] for r in rows],
                                "grad_norms": [r["grad_norm"] for r in rows],
                                "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def requires_grad_changed_after_initialize(tmp):
    """AdamW (weight decay 0.1), accumulation 2 at stages 0-3 (and in bf16 at stages 0 and
    2): after 2 optimizer steps the
    program freezes the first layer (requires_grad_(False)) and unfreezes the last, which it
    had frozen and left out of model_parameters before initialize; 2 more steps."""
    rec = {}
    for stage, bf16 in ((0, False), (1, False), (2, False), (3, False), (0, True), (2, True)):
        model = mlp()
        model[5].requires_grad_(False)
        extra = {"bf16": {"enabled": True}} if bf16 else {}
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=config(stage, gas=2, optimizer=adamw(wd=0.1), **extra))
        data = batches(8, 2)
        cast = torch.bfloat16 if bf16 else None
        rows = train(engine, data[:4], cast=cast)
        engine.module[0].requires_grad_(False)
        engine.module[5].requires_grad_(True)
        rows += train(engine, data[4:], cast=cast)
        rec[f"{'bf16_' if bf16 else ''}stage{stage}"] = {"losses": [r["loss"] for r in rows],
                                                        "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def program_changes_hyperparameters(tmp):
    """AdamW from the config at stages 0-3: after 2 optimizer steps the program sets weight
    decay, betas and eps in the groups of the optimizer initialize returned; 2 more steps."""
    rec = {}
    for stage in (0, 1, 2, 3):
        model = mlp()
        engine, optimizer, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(),
            config=config(stage, gas=2, clip=1.0, optimizer=adamw(wd=0.1)))
        data = batches(8, 2)
        rows = train(engine, data[:4])
        for group in optimizer.param_groups:
            group["weight_decay"] = 0.5
            group["betas"] = (0.5, 0.9)
            group["eps"] = 1e-3
        rows += train(engine, data[4:])
        rec[f"stage{stage}"] = {"losses": [r["loss"] for r in rows], "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def step_without_backward(tmp):
    """AdamW (weight decay 0.1), accumulation 2 at stages 0-3: after 2 optimizer steps the
    program calls engine.step() for a whole accumulation window without any backward (a
    skipped batch), then trains 2 more steps."""
    rec = {}
    for stage in (0, 1, 2, 3):
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, gas=2, optimizer=adamw(wd=0.1)))
        data = batches(8, 2)
        rows = train(engine, data[:4])
        empty = []
        try:
            for _ in range(2):
                engine.step()
                empty.append({"applied": engine.was_step_applied(), **counters(engine)})
        except Exception as exc:  # recorded: the comparison shows it
            rec[f"stage{stage}"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            del engine
            gc.collect()
            continue
        rows += train(engine, data[4:])
        rec[f"stage{stage}"] = {"losses": [r["loss"] for r in rows], "empty_steps": empty,
                                "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def module_load_state_dict_after_initialize(tmp):
    """Stages 0-2 in fp32 and bf16 (AdamW, accumulation 2): after 2 optimizer steps the program
    writes other weights with engine.module.load_state_dict (no load_checkpoint); the next
    forward, then 2 more steps. (DeepSpeed keeps separate master copies at stages 1-2 and in
    bf16, which such a write does not reach.)"""
    rec = {}
    for stage, bf16 in ((0, False), (1, False), (2, False), (0, True), (2, True)):
        model = mlp()
        extra = {"bf16": {"enabled": True}} if bf16 else {}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(stage, gas=2, optimizer=adamw(wd=0.1),
                                                        **extra))
        cast = torch.bfloat16 if bf16 else None
        data = batches(8, 2)
        rows = train(engine, data[:4], cast=cast)
        other = mlp(seed=5)
        if bf16:
            other = other.bfloat16()
        engine.module.load_state_dict(other.state_dict())
        rows += train(engine, data[4:], cast=cast)
        rec[f"{'bf16_' if bf16 else ''}stage{stage}"] = {
            "losses": [r["loss"] for r in rows], "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def torch_autocast_mode(tmp):
    """DeepSpeed's torch_autocast mode (fp32 parameters, the forward under torch.autocast,
    Linear/Conv gradients reduced in the autocast dtype, a GradScaler for fp16) per stage:
    losses, grad norms, counters, the output dtype, the parameters after (gathered: at
    stage 3 DeepSpeed gathers the Linear weights in the autocast dtype) and each
    parameter's comm_dtype attribute."""
    rec = {}
    bf16 = {"enabled": True, "dtype": "bfloat16"}
    fp16 = {"enabled": True, "dtype": "fp16"}
    cases = {"stage0_bf16": (0, bf16, {}), "stage1_bf16": (1, bf16, {}),
             "stage2_bf16": (2, bf16, {}), "stage3_bf16": (3, bf16, {}),
             "stage3_bf16_partitioned": (3, bf16, {"zero": {
                 "stage3_param_persistence_threshold": 0}}),
             "stage0_fp16": (0, fp16, {}), "stage2_fp16": (2, fp16, {}),
             "stage3_fp16": (3, fp16, {"zero": {"stage3_param_persistence_threshold": 0}}),
             "stage0_bf16_communication_bf16": (0, bf16, {"communication_data_type": "bf16"}),
             "stage2_bf16_communication_fp16": (2, bf16, {"communication_data_type": "fp16"}),
             "stage2_bf16_layernorm_only": (2, {**bf16, "lower_precision_safe_modules": [
                 "torch.nn.LayerNorm"]}, {}),
             "stage2_default_dtype": (2, {"enabled": True}, {})}
    for name, (stage, section, extra) in cases.items():
        model = mlp()
        extra = dict(extra)
        zero = extra.pop("zero", {})
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3),
                     zero_optimization={"stage": stage, **zero}, torch_autocast=section,
                     **extra)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=cfg)
        rec[name] = {"steps": train(engine, batches(8, 2)), "checksum": checksum(engine),
                     "comm_dtypes": [str(getattr(p, "comm_dtype", None))
                                     for p in engine.module.parameters()],
                     "enabled": engine.torch_autocast_enabled(),
                     "dtype": str(engine.torch_autocast_dtype())}
        del engine
        gc.collect()
    return rec


def outer_autocast(tmp):
    """A program that runs the engine's forward inside its own torch.autocast: DeepSpeed
    turns an outer autocast off for its forward when torch_autocast is off and the (CUDA)
    autocast flag is set, and runs its own torch_autocast settings when on."""
    rec = {}
    cases = {"fp32_cpu_autocast": ({}, False), "fp32_cuda_flag_set": ({}, True),
             "torch_autocast_fp16_inside_cpu_bf16": ({"torch_autocast": {
                 "enabled": True, "dtype": "fp16"}}, False),
             "torch_autocast_fp16_cuda_flag_set": ({"torch_autocast": {
                 "enabled": True, "dtype": "fp16"}}, True)}
    for name, (extra, cuda_flag) in cases.items():
        model = mlp()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config(2, optimizer=adamw(), **extra))
        rows = []
        for x, y in batches(3, 2):
            torch.set_autocast_enabled("cuda", cuda_flag)
            try:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = engine(x)
            finally:
                torch.set_autocast_enabled("cuda", False)
            loss = F.mse_loss(out.float(), y)
            engine.backward(loss)
            engine.step()
            rows.append({"loss": float(loss.item()), "out_dtype": str(out.dtype)})
        rec[name] = {"steps": rows, "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def torch_autocast_checkpoint(tmp):
    """torch_autocast across a checkpoint: at stage 3 (the model built under zero.Init) and at
    stage 2 in fp16 (DeepSpeed does not save the GradScaler), 2 optimizer steps, save, 2 more;
    a new engine loads the checkpoint and repeats those 2 steps."""
    rec = {}
    cases = {"stage3_bf16_zero_init": (3, "bfloat16", True),
             "stage2_fp16": (2, "fp16", False)}
    for name, (stage, dtype, zero_init) in cases.items():
        cfg = config(stage, gas=2, clip=1.0, optimizer=adamw(lr=3e-3),
                     torch_autocast={"enabled": True, "dtype": dtype})
        data = batches(8, 2)
        runs = []
        for load in (False, True):
            engine = initialized(mlp, cfg, zero_init=zero_init)
            if load:
                engine.load_checkpoint(tmp, tag=name)
                rows = train(engine, data[4:])
            else:
                rows = train(engine, data[:4])
                engine.save_checkpoint(tmp, tag=name)
                rows += train(engine, data[4:])
            runs.append({"losses": [r["loss"] for r in rows],
                         "grad_norms": [r["grad_norm"] for r in rows],
                         "comm_dtypes": [str(getattr(p, "comm_dtype", None))
                                         for p in engine.module.parameters()],
                         "checksum": checksum(engine)})
            del engine
            gc.collect()
        rec[name] = {"trained": runs[0], "loaded": runs[1]}
    return rec


def torch_adam_defaults(tmp):
    """Adam / AdamW from the config with only lr given: with torch_adam (DeepSpeed builds
    torch.optim.AdamW, or Adam with adam_w_mode false, from the params as given) and without
    (its FusedAdam): the parameters after 2 steps show which weight decay each trained with."""
    rec = {}
    cases = {"adamw_torch": ("AdamW", {"torch_adam": True}),
             "adam_torch": ("Adam", {"torch_adam": True}),
             "adam_torch_l2": ("Adam", {"torch_adam": True, "adam_w_mode": False}),
             "adamw_fused": ("AdamW", {})}
    for name, (kind_, extra) in cases.items():
        cfg = config(2, optimizer={"type": kind_, "params": {"lr": 1e-2, **extra}})
        engine = initialized(mlp, cfg)
        rec[name] = {"losses": [r["loss"] for r in train(engine, batches(3, 2))],
                     "checksum": checksum(engine),
                     "weight_decay": engine.optimizer.param_groups[0]["weight_decay"]}
        del engine
        gc.collect()
    return rec


def param_grad_after_backward(tmp):
    """What `p.grad` holds after engine.backward (accumulation 2) at stages 0-3 and in bf16 at
    stages 0-1: None, or its norm (a program clipping or logging gradients by hand reads it);
    and a program that clips p.grad by hand before each step at stage 0, in fp32 and bf16 (SGD,
    so the clip shows)."""
    rec = {}
    bf16 = {"bf16": {"enabled": True}}
    for name, stage, extra, hand_clip in (
            ("stage0", 0, {}, False), ("stage1", 1, {}, False), ("stage2", 2, {}, False),
            ("stage3", 3, {}, False), ("bf16_stage0", 0, bf16, False),
            ("bf16_stage1", 1, bf16, False), ("stage0_clipped_by_hand", 0, {}, True),
            ("bf16_stage0_clipped_by_hand", 0, bf16, True)):
        opt = {"type": "SGD", "params": {"lr": 0.1}} if hand_clip else adamw()
        engine = initialized(mlp, config(stage, gas=2, optimizer=opt, **extra))
        seen = []
        for x, y in batches(4, 2):
            out = engine(x.bfloat16() if extra else x)
            engine.backward(F.mse_loss(out.float(), y))
            if hand_clip and engine.is_gradient_accumulation_boundary():
                torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 0.05)
            seen.append([None if p.grad is None else float(p.grad.float().norm())
                         for p in engine.module.parameters()])
            engine.step()
        rec[name] = {"grads": seen, "checksum": checksum(engine)}
        del engine
        gc.collect()
    return rec


def gradient_precision(tmp):
    """The gradient a step gets in bf16 and fp16 (accumulation 3): deepspeed.utils.
    safe_get_full_grad after the boundary's backward, each parameter's first 16 values divided
    by its largest magnitude (so a loss scale cancels). DeepSpeed adds the micro-steps and reduces in
    the training dtype unless data_types.grad_accum_dtype / communication_data_type say
    otherwise (stages 0-1: local sum, then one reduction; stages 2-3: a reduction per
    micro-step, then the sum); one rounding elsewhere moves values by 2^-9 of their size. The
    keys spell the dtype out, so the values compare at fp32 tolerance. Stage 0 with another
    accumulation dtype is refused. (fp16 at stage 0 is left out: fp16_stage0_loss_scale.)"""
    from deepspeed.utils import safe_get_full_grad

    bf16, fp16 = {"bf16": {"enabled": True}}, {"fp16": {"enabled": True, "loss_scale": 1024}}
    cases = {"bfloat16_stage0": (0, bf16), "bfloat16_stage1": (1, bf16),
             "bfloat16_stage2": (2, bf16), "bfloat16_stage3": (3, bf16),
             "bfloat16_stage1_fp32_accumulation": (1, {**bf16, "data_types": {
                 "grad_accum_dtype": "fp32"}}),
             "bfloat16_stage3_fp32_accumulation": (3, {**bf16, "data_types": {
                 "grad_accum_dtype": "fp32"}}),
             "bfloat16_stage2_fp32_communication": (2, {**bf16,
                                                        "communication_data_type": "fp32"}),
             "float16_stage1": (1, fp16), "float16_stage2": (2, fp16),
             "float16_stage3": (3, fp16),
             "bfloat16_stage0_fp32_accumulation": (0, {**bf16, "data_types": {
                 "grad_accum_dtype": "fp32"}})}
    rec = {}
    for name, (stage, extra) in cases.items():
        cast = torch.bfloat16 if "bf16" in extra else torch.float16
        try:
            engine = initialized(mlp, config(stage, gas=3, optimizer=adamw(), **extra))
        except Exception as exc:  # stage 0 keeps the training dtype: refused
            rec[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        for i, (x, y) in enumerate(batches(3, 2)):
            engine.backward(F.mse_loss(engine(x.to(cast)).float(), y))
            if i == 2:
                grads = [safe_get_full_grad(p).double().flatten()
                         for p in engine.module.parameters()]
            engine.step()
        rec[name] = {"communication_data_type": str(engine.communication_data_type),
                     "grads": [(g / g.abs().max())[:16].tolist() for g in grads]}
        del engine
        gc.collect()
    return rec


def fp16_stage0_loss_scale(tmp):
    """fp16 at stage 0 with a torch optimizer (SGD, lr 0.1, static loss scale 1024): the
    losses and how far each step moves the first weight."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config(
        0, fp16={"enabled": True, "loss_scale": 1024}))
    weight = engine.module[0].weight
    rows = []
    for x, y in batches(3, 2):
        before = weight.detach().double().clone()
        loss = F.mse_loss(engine(x.half()).float(), y)
        engine.backward(loss)
        engine.step()
        rows.append({"loss": float(loss.item()),
                     "change": float((weight.detach().double() - before).norm())})
    return {"steps": rows}


SCENARIOS = [config_optimizer_scheduler_gas, _stage(0), _stage(1), _stage(2),
             client_optimizer_and_scheduler, client_optimizer_config_scheduler,
             client_sgd_not_allowed, offload_client_optimizer_refused,
             offload_client_optimizer_allowed, stage0_per_tensor_optimizer, _bf16(2), _bf16(3),
             adam_l2_mode, checkpoint_roundtrip, save_16bit_model_files, dataloader_order,
             dataloader_options,
             zero_init_and_gather, eval_mode_forward, batch_size_arithmetic, lr_schedules,
             full_tensor_accessors, gathered_write_without_modifier,
             no_sync_and_manual_boundary, tied_frozen_dropout_batchnorm,
             param_groups_with_own_lr, gradient_scaling_options, module_state_outside_gather,
             zero_init_variants, checkpoint_options, activation_checkpointing_and_config_forms,
             _bf16(0), _bf16(1), config_torch_optimizers_by_name, program_moves_the_lr,
             frozen_reference_engine, load_without_optimizer_or_scheduler,
             offload_with_config_optimizer, bf16_fp32_gradient_accumulation,
             backward_options, zero_communication_flags, program_built_deepspeed_schedules,
             comm_surface, argument_parser, optimizer_state_write,
             zero_init_dtype_and_disabled_gather, bf16_offload_and_fp32_communication,
             param_persistence, nonfinite_gradient, bf16_buffer_dtypes,
             masters_after_bf16_load, unused_parameters,
             requires_grad_changed_after_initialize, program_changes_hyperparameters,
             step_without_backward, module_load_state_dict_after_initialize,
             torch_autocast_mode, outer_autocast, torch_autocast_checkpoint,
             torch_adam_defaults, param_grad_after_backward, gradient_precision,
             fp16_stage0_loss_scale]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--only", default="")
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    wanted = {s for s in args.only.split(",") if s}
    records = {"deepspeed_version": deepspeed.__version__, "world": dist.get_world_size()}
    for scenario in SCENARIOS:
        name = scenario.__name__
        if wanted and name not in wanted:
            continue
        tmp = os.path.join(args.out, "tmp", name)
        os.makedirs(tmp, exist_ok=True)
        try:
            records[name] = scenario(tmp)
        except Exception as exc:  # recorded: the comparison shows it
            traceback.print_exc(file=sys.stderr)
            records[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        gc.collect()
        dist.barrier()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(records, f, indent=1, sort_keys=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
