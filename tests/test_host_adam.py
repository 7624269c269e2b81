"""The builder's choice of CPU Adam kernel (optim/builder.py) and what it costs in bits.

Config-built Adam/AdamW over host masters use torch's fused kernel (DeepSpeed uses its own
CPU kernel there too); `"torch_adam": true` and client optimizers keep torch's default. The
fused update differs from the for-loop one in the last bits; that difference is measured here
against a plain per-parameter reference and must stay at the rounding level.
"""
import pytest
import torch

import zerolite
from zerolite.optim.deepspeed_optimizers import FusedAdam
from zerolite.optim.builder import build_optimizer
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, LR, WD, batches, ds_config, tiny_gpt

STEPS = 6


def _groups(device="cpu"):
    return [{"params": [torch.nn.Parameter(torch.zeros(8, device=device))]}]


@pytest.mark.parametrize("opt_type", ["Adam", "AdamW"])
def test_config_adam_on_host_masters_is_fused(opt_type):
    opt = build_optimizer(opt_type, {"lr": 1e-3}, None, _groups())
    assert opt.defaults["fused"] is True
    # DeepSpeed's class for a config Adam/AdamW; AdamW maths for both (adam_w_mode defaults on).
    assert type(opt) is FusedAdam and opt.defaults["decoupled_weight_decay"] is True


def test_torch_adam_client_optimizers_and_device_masters_keep_torch_default():
    plain = build_optimizer("AdamW", {"lr": 1e-3, "torch_adam": True}, None, _groups())
    assert not plain.defaults["fused"]
    client = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    assert not build_optimizer(None, None, client, _groups()).defaults["fused"]
    # Masters that are not in host memory (an accelerator; "meta" stands in for it here).
    assert not build_optimizer("AdamW", {"lr": 1e-3}, None, _groups("meta")).defaults["fused"]
    assert not build_optimizer("SGD", {"lr": 1e-3}, None, _groups()).defaults.get("fused")


def test_fused_host_adam_drift_from_forloop_is_rounding_only():
    """10 steps on 1M elements: measured max |diff| 2.4e-7 with |param| <= 5 (a few ulp)."""
    g = torch.Generator().manual_seed(1)
    init = torch.randn(1 << 20, generator=g)
    grads = [torch.randn(1 << 20, generator=g) * 1e-2 for _ in range(10)]
    out = []
    for fused in (False, True):
        p = torch.nn.Parameter(init.clone())
        opt = (build_optimizer("AdamW", {"lr": 1e-3, "weight_decay": 0.01}, None, [{"params": [p]}])
               if fused else torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01))
        assert bool(opt.defaults["fused"]) is fused
        for gr in grads:
            p.grad = gr.clone()
            opt.step()
        out.append(p.detach())
    diff = (out[0] - out[1]).abs().max().item()
    moved = (out[0] - init).abs().max().item()
    assert diff <= 1e-6 < moved  # rounding-level, while the update itself is ~1e-2


def _train(rank, world):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world))
    assert engine.optimizer.defaults["fused"] is True
    return train_engine(engine, batches(STEPS), rank, world), gather_full_state_dict(engine.sharded)


def test_engine_fused_adamw_tracks_plain_torch_reference():
    """Measured: losses equal, worst param diff 3.0e-7 (the for-loop reference vs itself
    with fused=True: 1.9e-7)."""
    ref_losses, ref_params = train_reference(
        tiny_gpt(), batches(STEPS), lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=WD),
        clip=CLIP)
    losses, got = run_ranks(_train, 2)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-6, atol=0)
    worst = max((got[n] - v).abs().max().item() for n, v in ref_params.items())
    assert worst <= 2e-6, worst
