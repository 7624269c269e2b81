"""Each rank holds 1/N of params, grads and optimizer state, and no full buffer between steps."""
import math

import pytest

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

from gpt_cases import batches, ds_config, tiny_gpt


def _inspect(rank, world):
    model = tiny_gpt()
    total = sum(p.numel() for p in model.parameters())
    engine, optimizer, _, _ = zerolite.initialize(model=model, config=ds_config(world))
    train_engine(engine, batches(2), rank, world)
    flats = engine.sharded.flats
    report = {"total": total, "flats": [], "state_numels": [], "param_numels": [],
              "full_storage_bytes": [f.full.untyped_storage().nbytes() for f in flats],
              "gathered": engine.sharded.gathered_nbytes()}
    for f in flats:
        report["flats"].append((f.numel, f.shard.numel(), f.master.numel(), f.padded_numel))
    for state in optimizer.state.values():
        report["state_numels"] += [v.numel() for k, v in state.items() if k != "step"]
    report["param_numels"] = [p.numel() for p in model.parameters()]
    report["storage_bytes"] = [p.untyped_storage().nbytes() for p in model.parameters()]
    report["master_numels"] = [p.numel() for g in optimizer.param_groups for p in g["params"]]
    return report


@pytest.mark.parametrize("world", [2, 4])
def test_shards_are_one_nth_and_nothing_full_stays(world):
    for rank, rep in enumerate(run_ranks(_inspect, world)):
        assert sum(numel for numel, *_ in rep["flats"]) == rep["total"]
        for numel, shard, master, padded in rep["flats"]:
            assert shard == master == math.ceil(numel / world), (rank, numel, shard)
            assert padded == shard * world and padded - numel < world
        # optimizer state exists only for the shards (exp_avg and exp_avg_sq per master)
        assert sorted(rep["state_numels"]) == sorted(rep["master_numels"] * 2)
        assert sum(rep["master_numels"]) < rep["total"] / world + len(rep["flats"])
        # between steps no full parameter storage stays allocated
        assert rep["full_storage_bytes"] == [0] * len(rep["flats"])
        assert rep["gathered"] == 0
        assert rep["param_numels"] == [0] * len(rep["param_numels"])
        assert rep["storage_bytes"] == [0] * len(rep["storage_bytes"])
