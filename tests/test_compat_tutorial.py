"""DeepSpeed's CIFAR-tutorial-shaped script (tests/compat_scripts/cifar_style.py), unchanged,
with `deepspeed` resolved to zerolite, at world 2 for ZeRO stages 0-3 in fp32 and bf16,
against plain single-process PyTorch on the same global batches.

Ranks are forked (zerolite.testing) and each runs the script as `__main__` with the alias on
sys.path, as `-m zerolite.as_deepspeed` does (the launch itself: test_compat_entrypoints.py).
"""
import argparse
import copy
import json
import os
import runpy
import sys

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from zerolite.compat import SITE_DIR
from zerolite.optim.grad_norm import clip_grads_
from zerolite.testing.bf16_reference import bf16_atol, bf16_ulp
from zerolite.optim.lr_schedules import WarmupLR
from zerolite.testing.multiprocess import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "cifar_style.py")
WORLD = 2


def _run_script(rank, world, argv):
    sys.path.insert(0, SITE_DIR)
    sys.argv = [SCRIPT, *argv, f"--local_rank={rank}"]
    runpy.run_path(SCRIPT, run_name="__main__")


def _reference(dtype: str):
    """The script's model, data, optimizer and schedule in one process: each step takes the
    rows the engine's DistributedSampler gives every rank for that step. bf16: forward and
    backward of each rank's micro-batch in a bfloat16 copy of fp32 master weights; each
    micro-batch's gradients cast to fp32, summed over a rank's micro-batches, then over the
    ranks (what the engine promises: DESIGN.md, numerics). Note: this reference once summed
    the micro-batches' gradients in bf16 (backward into one .grad): off the engine by up to
    0.0039 on an AVX2-only CPU and 0.00195 with AVX-512-BF16, where the engine and this
    reference now agree exactly on both."""
    sys.path.insert(0, SITE_DIR)  # the script imports deepspeed at the top
    try:
        ns = runpy.run_path(SCRIPT, run_name="cifar_style_reference")
    finally:
        sys.path.remove(SITE_DIR)
        for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
            del sys.modules[name]
    trainset, testset = ns["Images"](ns["STEPS"] * ns["TRAIN_BATCH"], 1), ns["Images"](32, 2)
    torch.manual_seed(0)
    net = ns["Net"]()
    gas = ns["GAS"]
    micro = ns["TRAIN_BATCH"] // (gas * WORLD)
    orders = [list(DistributedSampler(trainset, num_replicas=WORLD, rank=r)) for r in range(WORLD)]
    config = ns["get_ds_config"](argparse.Namespace(dtype="fp32", stage=0))
    o = config["optimizer"]["params"]  # DeepSpeed's "Adam" is AdamW (adam_w_mode default)
    opt = torch.optim.AdamW(net.parameters(), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    sched = WarmupLR(opt, **config["scheduler"]["params"])
    low = torch.bfloat16 if dtype == "bf16" else torch.float32
    losses = []
    for step in range(ns["STEPS"]):
        work = copy.deepcopy(net).to(low)
        step_loss = 0.0
        grads = [torch.zeros_like(p) for p in net.parameters()]
        for order in orders:
            rank_grads = [torch.zeros_like(p) for p in net.parameters()]
            for m in range(gas):
                lo = (step * gas + m) * micro
                rows = order[lo:lo + micro]
                out = work(trainset.x[rows].to(low))
                loss = torch.nn.functional.cross_entropy(out, trainset.y[rows])
                (loss / (gas * WORLD)).backward()
                step_loss += loss.item() / (gas * WORLD)
                for g, w in zip(rank_grads, work.parameters()):
                    g.add_(w.grad.float())
                work.zero_grad(set_to_none=True)
            for g, rg in zip(grads, rank_grads):
                g.add_(rg)
        for p, g in zip(net.parameters(), grads):
            p.grad = g
        clip_grads_([p.grad for p in net.parameters()], config["gradient_clipping"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)
    with torch.no_grad():
        out = net.to(low)(testset.x.to(low)).float()
        eval_loss = torch.nn.functional.cross_entropy(out, testset.y).item()
    return losses, eval_loss, gas


@pytest.fixture(scope="module")
def references():
    return {}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_cifar_tutorial_script_matches_reference(stage, dtype, references, tmp_path):
    if dtype not in references:
        references[dtype] = _reference(dtype)
    ref_losses, ref_eval, gas = references[dtype]
    assert ref_losses[-1] < ref_losses[0] - 0.1  # it learns, so the bf16 bound has teeth
    run_ranks(_run_script, WORLD, ["--stage", str(stage), "--dtype", dtype, "--deepspeed",
                                   "--out", str(tmp_path)], timeout_s=180)
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    micro = torch.tensor([r["losses"] for r in runs])  # rank x micro-batch (equal sizes)
    losses = micro.view(WORLD, -1, gas).mean(dim=(0, 2))
    # bf16: each step's loss is the mean of bf16 micro-batch losses, each rounded once at the
    # end; fp32 sums in another order can flip that rounding by one ulp (measured: equal on
    # AVX-512-BF16 and AVX2 kernels). fp32: the project's parity bar.
    tol = (dict(rtol=1e-5, atol=1e-6) if dtype == "fp32"
           else dict(rtol=0, atol=bf16_atol(micro.flatten().tolist(), roundings=1)))
    torch.testing.assert_close(losses, torch.tensor(ref_losses), **tol)
    for r in runs:
        assert r["global_steps"] == len(ref_losses)
        assert r["client_state"]["step"] == len(ref_losses)  # beside DeepSpeed's bookkeeping
        assert r["client_state"]["ds_version"] == "0.19.8"
        assert r["eval_engine"] == pytest.approx(ref_eval, **({"rel": 1e-5} if dtype == "fp32"
                                                            else {"abs": bf16_ulp(ref_eval)}))
        # the raw module and the engine agree, and a checkpoint round-trip changes nothing
        assert r["eval_module"] == r["eval_engine"] == r["eval_after_load"]
