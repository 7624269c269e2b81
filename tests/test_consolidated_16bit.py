"""consolidated_16bit_state_dict / save_16bit_model go through the one full-flat gather at
every stage (stage 0 holds unsharded flats: one partition even with 2 ranks)."""
import pytest
import torch
from safetensors.torch import load_file

import zerolite
from zerolite.checkpoint import consolidated_16bit_state_dict, save_16bit_model
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

from gpt_cases import batches, ds_config, reference_run, tiny_gpt

STEPS = 2


def _consolidate(rank, world, stage, path):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=stage))
    train_engine(engine, batches(STEPS), rank, world)
    state = consolidated_16bit_state_dict(engine)
    save_16bit_model(engine, path)
    return state


@pytest.mark.parametrize("stage", [0, 3])
def test_consolidated_16bit_matches_reference(stage, tmp_path):
    _, ref = reference_run(STEPS)
    state, elsewhere = run_ranks(_consolidate, 2, stage, str(tmp_path))
    assert elsewhere == {}
    saved = load_file(str(tmp_path / "model.safetensors"))
    for name, value in ref.items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)
        torch.testing.assert_close(saved[name], value, rtol=1e-5, atol=1e-5, msg=name)
