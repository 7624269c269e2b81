"""Where a flat's bytes live (zerolite/zero/flat_placement.py, zerolite/offload/plan.py): each
offload config yields the expected placement per flat; a flat's placement is decided before
it is built and never changes; the training phase and a unit's gathered-ness each have one
record, and a bad unit transition raises."""
import dataclasses

import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.config.offload import OffloadConfig, OffloadOptimizerConfig, OffloadParamConfig
from zerolite.config import load_config
from zerolite.device import make_device_layer
from zerolite.errors import ZeroliteConfigError, ZeroliteStateError
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer
from zerolite.offload.host_placement import HostMaster, HostShard
from zerolite.offload.param_swap import FileShard
from zerolite.offload.plan import FileMaster, OffloadPlan, build_plan
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.flat_param import FlatParam
from zerolite.zero.flat_placement import (FlatPlacement, FlatSpec, MasterHome, PlacementPlan,
                                          ShardHome)
from zerolite.zero.sharded_model import TrainingState
from zerolite.zero.unit import Unit, UnitState

from gpt_cases import batches, ds_config, tiny_gpt

CPU = torch.device("cpu")


def _specs(dtype=torch.float32):
    """Four flats in model order: three optimized of 100, 100, 200 elements, one frozen."""
    return [FlatSpec(0, 0, 100, True, dtype, CPU), FlatSpec(1, 0, 100, True, dtype, CPU),
            FlatSpec(2, 0, 200, True, dtype, CPU), FlatSpec(2, 1, 50, False, dtype, CPU)]


def _homes(opt=None, param=None, dtype=torch.float32, separate_host=True, tmp_path=None,
           sub_group_size=10):
    oc = OffloadConfig(opt and OffloadOptimizerConfig(**opt),
                       param and OffloadParamConfig(**param), sub_group_size)
    plan = build_plan(oc, stage=3, quantized_weights=False, layer=make_device_layer(CPU),
                      rank=0, compute_dtype=dtype, separate_host=separate_host)
    placements = plan.place_all(_specs(dtype))
    return plan, placements, [(p.shard.home, p.master.home) for p in placements]


D, H, F = ShardHome.DEVICE, ShardHome.HOST, ShardHome.FILE


def test_no_offload_keeps_everything_on_the_device():
    plan, _, homes = _homes()
    assert type(plan) is PlacementPlan
    assert homes == [(D, MasterHome.SHARD)] * 3 + [(D, MasterHome.NONE)]
    _, _, homes = _homes(dtype=torch.bfloat16)
    assert homes == [(D, MasterHome.DEVICE)] * 3 + [(D, MasterHome.NONE)]


def test_cpu_optimizer_offload_places_masters_on_the_host_up_to_ratio():
    plan, placements, homes = _homes({"device": "cpu"})
    assert isinstance(plan, OffloadPlan)
    assert homes == [(D, MasterHome.HOST)] * 3 + [(D, MasterHome.NONE)]
    assert all(isinstance(p.master, HostMaster) for p in placements[:3])
    # ratio 0.5 of 400 optimized elements: the first two flats (100 + 100) go to the host
    _, _, homes = _homes({"device": "cpu", "ratio": 0.5})
    assert [m for _, m in homes] == [MasterHome.HOST, MasterHome.HOST, MasterHome.SHARD,
                                     MasterHome.NONE]
    # the model on the CPU: the host is the device, nothing is placed apart
    _, _, homes = _homes({"device": "cpu"}, separate_host=False)
    assert homes == [(D, MasterHome.SHARD)] * 3 + [(D, MasterHome.NONE)]


def test_cpu_param_offload_places_every_shard_on_the_host():
    _, placements, homes = _homes({"device": "cpu"}, {"device": "cpu"})
    assert homes == [(H, MasterHome.HOST)] * 3 + [(H, MasterHome.NONE)]
    assert all(isinstance(p.shard, HostShard) for p in placements)


def test_nvme_optimizer_offload_swaps_16bit_masters_only(tmp_path):
    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    _, placements, homes = _homes(nvme, dtype=torch.bfloat16)
    assert homes == [(D, MasterHome.FILE)] * 3 + [(D, MasterHome.NONE)]
    assert all(isinstance(p.master, FileMaster) for p in placements[:3])
    _, _, homes = _homes(nvme)  # fp32: the master IS the shard and stays in memory
    assert homes == [(D, MasterHome.SHARD)] * 3 + [(D, MasterHome.NONE)]


def test_nvme_param_offload_places_shards_in_files(tmp_path):
    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    _, placements, homes = _homes(nvme, nvme)  # fp32, both: the shard is read from the master
    assert homes == [(F, MasterHome.FILE)] * 3 + [(F, MasterHome.NONE)]
    assert all(isinstance(p.shard, FileShard) for p in placements)
    assert [p.shard.from_master is not None for p in placements] == [True] * 3 + [False]
    _, placements, homes = _homes(None, nvme, dtype=torch.bfloat16)
    assert homes == [(F, MasterHome.DEVICE)] * 3 + [(F, MasterHome.NONE)]
    with pytest.raises(ZeroliteConfigError, match="offload_optimizer.device 'nvme' too"):
        _homes(None, nvme)  # fp32 shard = master, but the optimizer would keep it in RAM


def test_refused_pairings_name_their_json_path(tmp_path):
    with pytest.raises(ZeroliteConfigError, match="offload_param.device: 'cpu' needs"):
        _homes({"device": "cpu", "ratio": 0.5}, {"device": "cpu"})
    with pytest.raises(ZeroliteConfigError, match="not implemented"):
        _homes({"device": "cpu"}, {"device": "nvme", "nvme_path": str(tmp_path)})


def test_unknown_offload_keys_are_refused_by_path():
    cfg = {"train_batch_size": 2, "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memmory": True}}}
    with pytest.raises(ZeroliteConfigError,
                       match=r"zero_optimization\.offload_optimizer\.pin_memmory"):
        load_config(cfg, 1)
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "buffer_count": 8}
    block = load_config(cfg, 1).zero_optimization.offload_optimizer
    assert isinstance(block, OffloadOptimizerConfig) and block.buffer_count == 8
    assert block["device"] == "cpu"  # DeepSpeed-style reads keep working


def test_placements_are_frozen():
    _, placements, _ = _homes({"device": "cpu"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        placements[0].shard = placements[3].shard


def test_a_flat_refuses_a_placement_that_does_not_fit_it():
    """An optimized flat given a placement without a master (a plan bug) refuses it."""
    p = nn.Parameter(torch.ones(4))
    no_master = PlacementPlan().placement_for(FlatSpec(0, 0, 4, False, torch.float32, CPU))
    assert isinstance(no_master, FlatPlacement) and no_master.master_home is MasterHome.NONE
    with pytest.raises(ZeroliteStateError, match="does not match"):
        FlatParam([(("w",), p)], rank=0, partitions=1, compute_dtype=torch.float32,
                  group_index=0, placement=no_master)


# -- one engine: placements never change, one record of phase and gathered-ness ----------------
def _engine_run(rank, world, zero, tmp_path):
    cfg = ds_config(world, stage=3, bf16=zero.pop("bf16", False))
    cfg["zero_optimization"].update(zero)
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=cfg, separate_host=True)
    flats = engine.sharded.flats
    before = [(id(f.placement), f.placement.shard.home, f.placement.master_home) for f in flats]
    seen = set()
    engine.module.register_forward_pre_hook(
        lambda m, a: seen.add(engine.sharded.state))
    train_engine(engine, batches(2), rank, world)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    engine.load_checkpoint(str(tmp_path / "ckpt"))
    after = [(id(f.placement), f.placement.shard.home, f.placement.master_home) for f in flats]
    sharded_after_step = [u.state for u in engine.sharded.units if not u.is_root]
    return (before == after, [h[1:] for h in before], seen, engine.sharded.state,
            isinstance(engine.basic_optimizer, ChunkedOffloadOptimizer), sharded_after_step)


@pytest.mark.parametrize("zero,shard,master,chunked", [
    ({}, D, MasterHome.SHARD, False),
    ({"offload_optimizer": {"device": "cpu"}}, D, MasterHome.HOST, False),
    ({"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
     H, MasterHome.HOST, False),
    ({"bf16": True, "offload_optimizer": {"device": "nvme", "nvme_path": "@"}}, D,
     MasterHome.FILE, True),
    ({"offload_optimizer": {"device": "nvme", "nvme_path": "@"},
      "offload_param": {"device": "nvme", "nvme_path": "@"}}, F, MasterHome.FILE, True),
], ids=["device", "cpu", "cpu+param", "nvme-bf16", "nvme+param"])
def test_a_flats_placement_never_changes_after_construction(tmp_path, zero, shard, master,
                                                            chunked):
    for block in zero.values():
        if isinstance(block, dict) and block.get("nvme_path") == "@":
            block["nvme_path"] = str(tmp_path / "swap")
    same, homes, seen, state, is_chunked, unit_states = run_ranks(
        _engine_run, 2, zero, tmp_path)[0]
    assert same
    optimized = [h for h in homes if h[1] is not MasterHome.NONE]
    assert optimized and all(h == (shard, master) for h in optimized)
    assert is_chunked == chunked
    assert seen == {TrainingState.FORWARD} and state is TrainingState.IDLE
    assert all(s is UnitState.SHARDED for s in unit_states)


def _bad_transitions(rank, world):
    p = nn.Parameter(torch.ones(6))
    flat = FlatParam([(("w",), p)], rank=rank, partitions=world, compute_dtype=torch.float32,
                     group_index=0)
    unit = Unit(1, "block", nn.Linear(1, 1), [flat])
    out = []
    for bad in (unit.wait_gathered, lambda: unit._move(UnitState.GATHERED),
                lambda: unit._move(UnitState.SHARDED)):
        try:
            bad()
            out.append(None)
        except ZeroliteStateError as e:
            out.append(str(e))
    assert not flat.is_full_allocated
    return out, unit.state


def test_every_bad_unit_transition_raises():
    errors, state = run_ranks(_bad_transitions, 1)[0]
    assert all(e is not None and "zerolite bug" in e for e in errors), errors
    assert state is UnitState.SHARDED
