"""Config values zerolite cannot honour are refused by name, and keys it ignores are said
once per job at start-up (one line, on rank 0)."""
from __future__ import annotations

import logging
import re

import pytest

import zerolite
from zerolite.config import load_config
from zerolite.config.support import SWITCHED_ON_REFUSED
from zerolite.errors import ZeroliteConfigError
from zerolite.testing.multiprocess import run_ranks

from gpt_cases import tiny_gpt

BASE = {"train_batch_size": 4}


@pytest.mark.parametrize("value", [0, -1, 1.5, "big"])
def test_sub_group_size_must_be_positive(value):
    with pytest.raises(ZeroliteConfigError, match=r"zero_optimization\.sub_group_size"):
        load_config({**BASE, "zero_optimization": {"stage": 3, "sub_group_size": value}}, 1)


@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_bias_correction_false_is_refused(kind):
    cfg = {**BASE, "optimizer": {"type": kind, "params": {"bias_correction": False}}}
    with pytest.raises(ZeroliteConfigError,
                       match=r"optimizer\.params\.bias_correction.*false is not supported"):
        load_config(cfg, 1)
    cfg["optimizer"]["params"]["bias_correction"] = True
    assert load_config(cfg, 1).optimizer.params["bias_correction"] is True


def _startup_lines(rank, world):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("zerolite").addHandler(handler)
    config = {**BASE, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3, "overlap_comm": True, "sub_group_size": 1000,
                                    "contiguous_gradients": True},  # DeepSpeed's default: inert
              "flops_profiler": {"enabled": True}}
    model = tiny_gpt()
    zerolite.initialize(model=model, model_parameters=model.parameters(), config=config)
    return [r.getMessage() for r in records if "accepted but have no effect" in r.getMessage()]


def test_ignored_keys_are_listed_once_per_job():
    lines = run_ranks(_startup_lines, 2)
    assert lines[1] == []
    assert len(lines[0]) == 1, lines
    # (sub_group_size is honoured since the offload merge: the optimizer steps in chunks)
    for key in ("zero_optimization.overlap_comm", "flops_profiler"):
        assert key in lines[0][0], lines[0][0]
    assert "contiguous_gradients" not in lines[0][0]  # a default value changes nothing


def _switched_on(key, when):
    value = {"true": True, "> 1": 2, "set": {"x": 1}}[when]
    cfg = dict(BASE)
    node = cfg
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return cfg


@pytest.mark.parametrize("key", sorted(SWITCHED_ON_REFUSED))
def test_features_that_change_training_are_refused_when_switched_on(key):
    """DeepSpeed features zerolite does not implement and that would change what is trained
    fail the config naming the key, never load and train differently; switched off (false,
    1, null) they load."""
    when, why = SWITCHED_ON_REFUSED[key]
    with pytest.raises(ZeroliteConfigError, match=re.escape(key)) as info:
        load_config(_switched_on(key, when), 1)
    assert why in str(info.value)
    off = _switched_on(key, when)
    node = off
    for part in key.split(".")[:-1]:
        node = node[part]
    node[key.split(".")[-1]] = {"true": False, "> 1": 1, "set": None}[when]
    load_config(off, 1)
