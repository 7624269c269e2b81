"""Exact gradient scale: plain SGD (no momentum, no clipping, no weight decay) is not scale
invariant, so a missing 1/gas, a wrong 1/world or a wrong predivide factor changes every
update. Compared with plain single-process PyTorch on the same global batch, which uses
torch's own SGD and computes its gradient norm with torch.linalg.vector_norm over the full
gradients (no zerolite helper on the reference side)."""
from __future__ import annotations

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import GLOBAL_BATCH, batches, tiny_gpt

LR = 0.3
STEPS = 6
GAS = 2


def sgd_reference():
    model = tiny_gpt()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0)
    losses, norms = [], []
    for x, y in batches(STEPS):
        loss = model(x, y)
        loss.backward()
        full = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        norms.append(torch.linalg.vector_norm(full.double()).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(rank, world, stage, extra):
    model = tiny_gpt()
    config = {"train_batch_size": GLOBAL_BATCH, "gradient_accumulation_steps": GAS,
              "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.0}},
              "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_reuse_distance": 0}, **extra}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=config)
    losses, norms = [], []
    for batch in batches(STEPS):
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, GAS):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / (world * GAS))
        norms.append(float(engine.get_global_grad_norm()))
    return losses, norms, gather_full_state_dict(engine.sharded)


@pytest.mark.parametrize("world, stage, extra", [
    (2, 3, {}), (4, 3, {}), (2, 0, {}), (2, 1, {}), (2, 2, {}),
    (2, 3, {"prescale_gradients": True, "gradient_predivide_factor": 2.0}),
], ids=["w2-s3", "w4-s3", "w2-s0", "w2-s1", "w2-s2", "w2-s3-predivide"])
def test_unclipped_sgd_matches_reference(world, stage, extra):
    ref_losses, ref_norms, ref_params = sgd_reference()
    losses, norms, params = run_ranks(_train, world, stage, extra)[0]
    # the update is lr x grad: any scale error on the grads moves losses from step 2 on
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    # get_global_grad_norm against torch.linalg.vector_norm of the reference's full grads
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), rtol=1e-5, atol=0)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")

