"""Bad input to initialize() fails with one clear ZeroliteConfigError, before any rank work."""
import json

import pytest
import torch.distributed as dist

import zerolite
from zerolite import ZeroliteConfigError

from gpt_cases import tiny_gpt


def _init(config, world=1, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setenv("WORLD_SIZE", str(world))
    return zerolite.initialize(model=tiny_gpt(), config=config)


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(ZeroliteConfigError, match="nope.json"):
        _init(str(path))
    assert not dist.is_initialized()


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    # invalid as JSON and as Hjson (a trailing comma is fine in Hjson, which is read when the
    # hjson package is installed, as DeepSpeed reads configs)
    path.write_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 3]\n}\n')
    with pytest.raises(ZeroliteConfigError, match=r"broken\.json.*line 3"):
        _init(str(path))
    assert not dist.is_initialized()


def test_batch_triple_that_does_not_multiply_out(monkeypatch):
    cfg = {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
           "gradient_accumulation_steps": 2}
    with pytest.raises(ZeroliteConfigError) as err:
        _init(cfg, world=2, monkeypatch=monkeypatch)
    message = str(err.value)
    for needle in ("train_batch_size", "10", "train_micro_batch_size_per_gpu",
                   "gradient_accumulation_steps", "world_size=2", "nproc_per_node"):
        assert needle in message, (needle, message)
    assert "\n" not in message


@pytest.mark.parametrize("stage", [4, -1, "3"])
def test_stage_outside_0_to_3(stage):
    with pytest.raises(ZeroliteConfigError, match="zero_optimization.stage"):
        _init({"train_batch_size": 4, "zero_optimization": {"stage": stage}})


def test_config_from_args_and_kwarg_is_an_error(tmp_path):
    import argparse

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 4}))
    args = argparse.Namespace(deepspeed_config=str(path), deepspeed=True)
    with pytest.raises(ZeroliteConfigError, match="twice"):
        zerolite.initialize(args=args, model=tiny_gpt(), config={"train_batch_size": 4})


def test_model_must_be_a_module():
    with pytest.raises(ZeroliteConfigError, match="torch.nn.Module"):
        zerolite.initialize(model="gpt", config={"train_batch_size": 4})
