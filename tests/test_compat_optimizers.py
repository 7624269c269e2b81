"""DeepSpeed's optimizer classes (deepspeed.ops.*) passed as `optimizer=` run on zerolite's
fp32 shards with DeepSpeed's arguments and give the update of the torch optimizer they name
(world 2, ZeRO-3, against a single-process reference)."""
import copy

import pytest
import torch

import zerolite
from zerolite.compat.deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from zerolite.compat.deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from zerolite.compat.deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
from zerolite.optim.flat_optimizers import Lion
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import batches, ds_config, tiny_gpt

STEPS = 4
# Note: Adagrad's eps is raised from DeepSpeed's 1e-10: with it, a near-zero gradient moves a
# weight by about lr x sign(grad), so reduction-order rounding flips single embedding rows.
CASES = {
    "FusedAdam": (FusedAdam, dict(lr=3e-3, weight_decay=0.1),
                  torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.1)),
    "FusedAdam-L2": (FusedAdam, dict(lr=3e-3, weight_decay=0.1, adam_w_mode=False),
                     torch.optim.Adam, dict(lr=3e-3, weight_decay=0.1)),
    "DeepSpeedCPUAdam": (DeepSpeedCPUAdam, dict(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.05),
                         torch.optim.AdamW, dict(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.05)),
    "DeepSpeedCPUAdam-L2": (DeepSpeedCPUAdam, dict(lr=2e-3, weight_decay=0.05, adamw_mode=False),
                            torch.optim.Adam, dict(lr=2e-3, weight_decay=0.05)),
    "DeepSpeedCPUAdagrad": (DeepSpeedCPUAdagrad, dict(lr=5e-2, eps=1e-4, weight_decay=0.01),
                            torch.optim.Adagrad, dict(lr=5e-2, eps=1e-4, weight_decay=0.01)),
    "DeepSpeedCPULion": (DeepSpeedCPULion, dict(lr=1e-3, weight_decay=0.1),
                         Lion, dict(lr=1e-3, weight_decay=0.1)),
    "FusedLion": (FusedLion, dict(lr=1e-3, betas=(0.95, 0.98)), Lion,
                  dict(lr=1e-3, betas=(0.95, 0.98))),
}


def _train(rank, world, name):
    cls, kwargs, _, _ = CASES[name]
    model = tiny_gpt()
    config = ds_config(world, stage=3, gradient_clipping=0.0)
    del config["optimizer"]
    engine, optimizer, *_ = zerolite.initialize(model=model, optimizer=cls(model.parameters(),
                                                                           **kwargs),
                                                config=config)
    losses = train_engine(engine, batches(STEPS), rank, world)
    return losses, gather_full_state_dict(engine.sharded), type(optimizer).__name__


@pytest.mark.parametrize("name", sorted(CASES))
def test_deepspeed_optimizer_class_matches_its_torch_update(name):
    _, _, ref_cls, ref_kwargs = CASES[name]
    ref_losses, ref_params = train_reference(copy.deepcopy(tiny_gpt()), batches(STEPS),
                                             lambda p: ref_cls(p, **ref_kwargs))
    losses, params, opt_name = run_ranks(_train, 2, name)[0]
    assert opt_name == CASES[name][0].__name__  # rebuilt over the shards with the same class
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for key, value in ref_params.items():
        torch.testing.assert_close(params[key], value, rtol=1e-5, atol=1e-5, msg=key)
