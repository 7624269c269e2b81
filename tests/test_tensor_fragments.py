"""deepspeed.utils' tensor-fragment API at ZeRO stages 1-3, world 2, fp32, against one PyTorch
process on the same global batches: full fp32 params, averaged grads (gradient accumulation
2, partial sums between micro-steps), AdamW's exp_avg / exp_avg_sq, and writes of each kind
changing training exactly as the same write to the reference does. Parameters straddle the
rank boundary of their unit's flat (odd sizes), so every read and write is assembled from
two ranks' pieces."""
import copy

import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.compat.deepspeed import utils as du
from zerolite.testing.multiprocess import run_ranks

WORLD, GAS, MICRO, STEPS, LR, WD = 2, 2, 2, 3, 1e-2, 0.01


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
        self.head = nn.Linear(3, 1)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3), requires_grad=False)

    def forward(self, x, t):
        return ((self.head(torch.tanh(self.blocks(x)) * self.scale) - t) ** 2).mean()


def net():
    torch.manual_seed(0)
    return Net()


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(WORLD * GAS * MICRO, 5, generator=g),
             torch.randn(WORLD * GAS * MICRO, 1, generator=g)) for _ in range(STEPS)]


def micro(batch, rank, i):
    x, t = batch
    lo = rank * GAS * MICRO + i * MICRO
    return x[lo:lo + MICRO], t[lo:lo + MICRO]


# The writes both sides make, each through one call of the API under test:
#   step 1, after the boundary backward: every grad halved (safe_update_full_grad_vectorized
#           for the blocks, safe_set_full_grad for the head);
#   step 1, after the step: exp_avg doubled (safe_set_full_optimizer_state);
#   step 2, before its forward: every param scaled by 0.9 (safe_set_full_fp32_param).


def reference():
    """Per step: the partial grads after each micro-step, then params and AdamW state."""
    model = net()
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(named.values(), lr=LR, weight_decay=WD)
    out = []
    for step, batch in enumerate(data()):
        if step == 2:
            for p in named.values():
                p.data.mul_(0.9)
        partials = []
        for i in range(GAS):
            for rank in range(WORLD):
                (model(*micro(batch, rank, i)) / (GAS * WORLD)).backward()
            partials.append({n: p.grad.clone() for n, p in named.items()})
        if step == 1:
            for p in named.values():
                p.grad.mul_(0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1:
            for p in named.values():
                opt.state[p]["exp_avg"].mul_(2)
        out.append({"grads": partials,
                    "params": {n: p.detach().clone() for n, p in named.items()},
                    "exp_avg": {n: opt.state[p]["exp_avg"].clone() for n, p in named.items()},
                    "exp_avg_sq": {n: opt.state[p]["exp_avg_sq"].clone()
                                   for n, p in named.items()}})
    return out


def config(stage, **zero):
    return {"train_batch_size": WORLD * GAS * MICRO, "gradient_accumulation_steps": GAS,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                  "stage3_max_reuse_distance": 0, **zero}}


def _train(rank, world, stage, zero):
    from zerolite.zero.flat_placement import MasterHome

    model = net()  # separate_host: offload 'cpu' really separate on the CPU
    engine, *_ = zerolite.initialize(model=model, config=config(stage, **zero), separate_host=True)
    kind = zero.get("offload_optimizer", {}).get("device")
    if kind == "nvme":  # Adam's state lives in swap files (offload/chunked_optimizer.py)
        assert type(engine.optimizer.state).__name__ == "OffloadedState"
    for f in (f for f in engine.sharded.flats if f.master is not None and kind == "cpu"):
        assert f.placement.master_home is MasterHome.HOST, f
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    out = []
    for step, batch in enumerate(data()):
        if step == 2:
            for p in named.values():
                du.safe_set_full_fp32_param(p, du.safe_get_full_fp32_param(p) * 0.9)
        partials = []
        for i in range(GAS):
            engine.backward(engine(*micro(batch, rank, i)))
            partials.append({n: du.safe_get_full_grad(p) for n, p in named.items()})
            if step == 1 and i == GAS - 1:
                du.safe_update_full_grad_vectorized(list(engine.module.blocks.parameters()),
                                                    lambda g, p: g * 0.5)
                for p in engine.module.head.parameters():
                    du.safe_set_full_grad(p, du.safe_get_full_grad(p) * 0.5)
            engine.step()
        if step == 1:
            for p in named.values():
                du.safe_set_full_optimizer_state(
                    p, du.safe_get_full_optimizer_state(p, "exp_avg") * 2, "exp_avg")
        out.append({"grads": partials,
                    "params": {n: du.safe_get_full_fp32_param(p) for n, p in named.items()},
                    "exp_avg": {n: du.safe_get_full_optimizer_state(p, "exp_avg")
                                for n, p in named.items()},
                    "exp_avg_sq": {n: du.safe_get_full_optimizer_state(p, "exp_avg_sq")
                                   for n, p in named.items()}})
    return out


def _close(got, want, what, atol=1e-7):
    assert got.dtype == torch.float32 and got.shape == want.shape, (what, got.dtype, got.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=atol, msg=what)


def _compare(results, atol=1e-7):
    want = reference()
    for rank, got in enumerate(results):
        for step, (g, w) in enumerate(zip(got, want)):
            for i in range(GAS):
                for n in w["params"]:
                    _close(g["grads"][i][n], w["grads"][i][n],
                           f"rank {rank} step {step} micro {i} grad {n}", atol)
            for key in ("params", "exp_avg", "exp_avg_sq"):
                for n in w[key]:
                    _close(g[key][n], w[key][n], f"rank {rank} step {step} {key} {n}", atol)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fragments_match_reference(stage):
    _compare(run_ranks(_train, WORLD, stage, {}))


@pytest.mark.parametrize("offload", ["cpu", "nvme"])
def test_fragments_with_offloaded_optimizer(offload, tmp_path):
    """Masters, grads and Adam state in host memory (a separate copy even on CPU) or in swap
    files. The host step is torch's fused Adam: within 2.4e-7 of the for-loop's
    (zerolite/optim/builder.py), hence the wider atol."""
    block = {"device": offload, **({"nvme_path": str(tmp_path)} if offload == "nvme" else {})}
    _compare(run_ranks(_train, WORLD, 3, {"offload_optimizer": block}), atol=2e-6)


def _edges(rank, world, stage):
    from zerolite.fragments import OptimizerStateKeyError

    model = net()
    engine, *_ = zerolite.initialize(model=model, config=config(stage))
    w, frozen, outside = model.blocks[0].weight, model.scale, nn.Parameter(torch.ones(2))
    outside.grad = torch.full((2,), 3.0)
    with pytest.raises(OptimizerStateKeyError, match="no state yet"):
        du.safe_get_full_optimizer_state(w, "exp_avg")
    assert du.safe_get_full_fp32_param(frozen) is None and du.safe_get_full_grad(frozen) is None
    assert du.safe_get_full_optimizer_state(frozen, "exp_avg") is None
    du.safe_set_full_fp32_param(frozen, torch.zeros(3))  # ignored, as DeepSpeed does
    assert du.safe_get_full_fp32_param(outside) is None
    assert torch.equal(du.safe_get_full_grad(outside), outside.grad)
    with pytest.raises(AssertionError, match="Number of elements do not match: 3 != 35"):
        du.safe_set_full_fp32_param(w, torch.zeros(3))
    batch = data()[0]
    for i in range(GAS):
        engine.backward(engine(*micro(batch, rank, i)))
        engine.step()
    with pytest.raises(ValueError, match="only available immediately after backward"):
        du.safe_get_full_grad(w)
    with pytest.raises(ValueError, match="only available immediately after backward"):
        du.safe_set_full_grad(w, torch.zeros(7, 5))
    for kind in (KeyError, ValueError):  # DeepSpeed: ValueError at stages 1-2, KeyError at 3
        with pytest.raises(kind, match="nope not found in optimizer state fragment"):
            du.safe_get_full_optimizer_state(w, "nope")
    if stage != 3:
        with pytest.raises(AssertionError, match="only defined for ZeRO-3"):
            du.safe_get_local_fp32_param(w)
        return None
    with pytest.raises(AssertionError, match="only defined for ZeRO-3"):
        du.safe_get_local_fp32_param(outside)
    assert du.safe_get_local_fp32_param(frozen) is None
    full = du.safe_get_full_fp32_param(w)
    local = du.safe_get_local_fp32_param(w)
    du.safe_set_local_fp32_param(w, local * 2)
    doubled = du.safe_get_full_fp32_param(w)
    avg_sq_local = du.safe_get_local_optimizer_state(w, "exp_avg_sq")
    du.safe_set_local_optimizer_state(w, avg_sq_local + 1, "exp_avg_sq")
    with pytest.raises(AssertionError, match="Number of elements do not match: 35 != 18"):
        du.safe_set_local_fp32_param(w, full)
    engine.backward(engine(*micro(batch, rank, 0)))
    local_grad = du.safe_get_local_grad(w)
    du.safe_set_local_grad(w, torch.ones_like(local_grad))
    return {"full": full, "local": local, "doubled": doubled, "local_grad": local_grad,
            "full_grad": du.safe_get_full_grad(w),
            "avg_sq": du.safe_get_full_optimizer_state(w, "exp_avg_sq"),
            "avg_sq_local": avg_sq_local}


def _ds_partition(full, rank):
    """DeepSpeed's local partition: ceil(numel / world) elements of the flattened value."""
    flat = full.reshape(-1)
    n = -(-flat.numel() // WORLD)
    return torch.cat([flat, flat.new_zeros(n * WORLD - flat.numel())])[rank * n:(rank + 1) * n]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fragment_none_cases_and_errors(stage):
    results = run_ranks(_edges, WORLD, stage)
    if stage != 3:
        return
    full = results[0]["full"]
    whole_sq = torch.cat([results[r]["avg_sq_local"] for r in range(WORLD)])
    for rank, r in enumerate(results):
        assert r["local"].shape == (18,)  # ceil(35 / 2); rank 1's last element is padding
        assert torch.equal(r["local"], _ds_partition(full, rank))
        torch.testing.assert_close(r["doubled"], full * 2, rtol=0, atol=0)
        torch.testing.assert_close(r["avg_sq"].reshape(-1), whole_sq[:35] + 1)
        # the local grad written as ones everywhere reads back as ones (the padding drops)
        torch.testing.assert_close(r["full_grad"], torch.ones(7, 5), rtol=0, atol=0)
    grad = torch.cat([results[r]["local_grad"] for r in range(WORLD)])
    assert grad[35:].abs().sum() == 0  # the padding of rank 1's partition


def _bf16(rank, world, stage):
    from zerolite.zero import GatheredParameters
    from zerolite.zero.sharded_model import gather_full_state_dict

    model = net()
    cfg = {**config(stage), "bf16": {"enabled": True}}
    engine, *_ = zerolite.initialize(model=model, config=cfg)
    batch = data()[0]
    for i in range(GAS):
        engine.backward(engine(*(t.bfloat16() for t in micro(batch, rank, i))))
        engine.step()
    w = model.blocks[0].weight
    masters = gather_full_state_dict(engine.sharded)
    got = du.safe_get_full_fp32_param(w)
    value = torch.linspace(-1, 1, 35).view(7, 5) + 1e-3  # not representable in bf16
    du.safe_set_full_fp32_param(w, value)
    with GatheredParameters([w]):
        seen = w.detach().clone()
    return got, masters["blocks.0.weight"], du.safe_get_full_fp32_param(w), value, seen


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_reads_and_writes_the_fp32_master(stage):
    for got, master, after, value, seen in run_ranks(_bf16, WORLD, stage):
        assert got.dtype == torch.float32 and torch.equal(got, master)
        assert torch.equal(after, value)  # the fp32 master keeps every bit
        assert seen.dtype == torch.bfloat16 and torch.equal(seen, value.bfloat16())
