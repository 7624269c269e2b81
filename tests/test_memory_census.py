"""engine.memory_stats() accounts for the tensors a rank holds between steps: the sum of its
byte counts against a census of every live tensor storage in the rank (gc), at ZeRO-3 with
DeepSpeed's default live-parameter settings (reuse distance 1e9: whole model gathered between
forward and backward, so the buffer pool keeps that many full buffers afterwards)."""
from __future__ import annotations

import gc

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

from gpt_cases import batches, tiny_gpt


def _live_storages() -> dict[int, int]:
    """data_ptr -> nbytes of every live CPU tensor storage in this process."""
    gc.collect()
    seen = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                if storage.data_ptr():
                    seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError, ReferenceError):
            continue
    return seen


def _census(rank, world, bf16, swap_dir=None):
    # The rank is forked from pytest: tensors the earlier tests left alive are not ours.
    inherited = _live_storages()
    model = tiny_gpt()
    cfg = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 3}, "bf16": {"enabled": bf16}}
    if swap_dir:  # the param shards on disk: what is in RAM of them is the read buffers
        cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": swap_dir}
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg)
    del model
    train_engine(engine, batches(2), rank, world)
    ms = engine.memory_stats()
    accounted = sum(ms[k] for k in ("param_shards", "master_shards", "optimizer_state",
                                    "gathered", "buffer_pool", "param_read_buffers"))
    live = sum(n for ptr, n in _live_storages().items() if ptr not in inherited)
    return live, accounted, ms["buffer_pool"]


@pytest.mark.parametrize("bf16,param_nvme", [(False, False), (True, False), (True, True)],
                         ids=["fp32", "bf16", "bf16-offload_param-nvme"])
def test_memory_stats_accounts_for_the_live_tensors(bf16, param_nvme, tmp_path):
    live, accounted, pool = run_ranks(_census, 2, bf16, str(tmp_path) if param_nvme else None)[0]
    assert pool > 0.3 * live  # the point of the key: here it is a third or more of the tensors
    # What is left: the batch, Adam's step scalars, the model's tiny non-flat buffers.
    assert 0 <= live - accounted < 0.02 * live, (live, accounted)
