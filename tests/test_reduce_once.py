"""zerolite.reduce_once_per_step: with gradient accumulation, stages 2-3 keep full fp32
gradients across micro-steps and reduce once per optimizer step. Same training as the
single-process reference; half the reduction bytes at accumulation 2."""
import json

import pytest
import torch

import zerolite
from zerolite.cli.check_config import main as check_config_main
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import GAS, batches, ds_config, reference_run, tiny_gpt

STEPS = 8


def _train(rank, world, stage, once):
    cfg = ds_config(world, stage=stage)
    cfg["zerolite"] = {"reduce_once_per_step": once}
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    losses = train_engine(engine, batches(STEPS), rank, world)
    reduced = sum(engine.sharded.reducer.bytes_sent.values())
    return losses, gather_full_state_dict(engine.sharded), reduced


@pytest.mark.parametrize("stage", [2, 3])
def test_reduce_once_matches_reference_with_half_the_reduction_bytes(stage):
    assert GAS == 2
    ref_losses, ref_params = reference_run(STEPS)
    once = run_ranks(_train, 2, stage, True)
    every = run_ranks(_train, 2, stage, False)
    for (losses, params, reduced), (_, _, reduced_every) in zip(once, every):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses),
                                   rtol=1e-5, atol=0)
        for name in ref_params:
            torch.testing.assert_close(params[name], ref_params[name], rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{name}: {m}")
        assert reduced * GAS == reduced_every, (reduced, reduced_every)


def test_check_config_reports_the_memory_cost(tmp_path, capsys):
    path = tmp_path / "c.json"
    cfg = ds_config(2, stage=3)
    cfg["zerolite"] = {"reduce_once_per_step": True}
    path.write_text(json.dumps(cfg))
    assert check_config_main([str(path), "--world-size", "2", "--params", "1000000"]) == 0
    out = capsys.readouterr().out
    assert "reduce_once_per_step extra" in out and "3.815 MiB per rank" in out, out
