"""client_state and scheduler state through a checkpoint, as DeepSpeed gives them back: the
same types (tuples, int keys, Counter, OrderedDict, tensors), under stage 3 each rank's own,
under stages 0-2 rank 0's; what needs pickle is refused by name before anything is written."""
import enum
import json
import math
import os
from collections import Counter, OrderedDict, defaultdict
from pathlib import Path

import pytest
import torch

import zerolite
from zerolite.checkpoint import state_tree
from zerolite.testing.multiprocess import run_ranks

from gpt_cases import ds_config, tiny_gpt

STATE = {
    "epoch": 3, "ratio": 0.25, "inf": math.inf, "name": "run", "flag": True, "none": None,
    "betas": (0.9, 0.999), "nested": [{"a": (1, [2, 3])}, []],
    "by_step": {10: "warm", 20: "decay"}, "milestones": Counter({30: 1, 80: 2}),
    "ordered": OrderedDict([("z", 1), ("a", 2)]), "tuple_keys": {(1, 2): "x"},
    "marker": {"__zerolite__": "user data"}, "raw": b"\x00\xff",
    "score": torch.tensor(0.125), "ids": torch.arange(6, dtype=torch.int32).reshape(2, 3),
    "half": torch.ones(3, dtype=torch.bfloat16), "mask": torch.tensor([True, False]),
}


def _same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys())
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def test_round_trip_keeps_types():
    tree, tensors = state_tree.encode(STATE, "client_state")
    tree = json.loads(json.dumps(tree))  # what meta.json gives back
    _same(state_tree.decode(tree, lambda key: tensors[int(key)].clone()), STATE)
    assert state_tree.has_tensors(tree) and not state_tree.has_tensors({"a": [1, (2,)]})


class Mode(enum.Enum):
    TRAIN = 1


@pytest.mark.parametrize("value, where, what", [
    ({"args": Path("/x")}, "client_state['args']", "PosixPath"),
    ({"mode": Mode.TRAIN}, "client_state['mode']", "Mode"),
    ({"f": [print]}, "client_state['f'][0]", "builtin_function_or_method"),
    ({"d": defaultdict(int)}, "client_state['d']", "defaultdict"),
    ({"s": torch.eye(2).to_sparse()}, "client_state['s']", "sparse"),
    ({"c": torch.zeros(2, dtype=torch.complex64)}, "client_state['c']", "complex64"),
])
def test_what_needs_pickle_is_refused_by_name(value, where, what):
    with pytest.raises(TypeError) as e:
        state_tree.encode(value, "client_state")
    assert where in str(e.value) and what in str(e.value)


# -- through the engine ----------------------------------------------------------------------
def _engine(world, stage, sched=None):
    model = tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    lr_scheduler = None if sched is None else sched(opt)
    cfg = ds_config(world, stage=stage, gas=1)
    del cfg["optimizer"]
    engine, *_ = zerolite.initialize(model=model, optimizer=opt, lr_scheduler=lr_scheduler,
                                     config=cfg)
    return engine


def _rank_states(rank, world, save_dir, stage):
    engine = _engine(world, stage)
    mine = {**STATE, "rank": rank, "rng": torch.full((4,), float(rank))}
    engine.save_checkpoint(save_dir, tag="t", client_state=mine)
    _, got = _engine(world, stage).load_checkpoint(save_dir, tag="t")
    expect = mine if stage == 3 else {**STATE, "rank": 0, "rng": torch.zeros(4)}
    _same({k: got[k] for k in expect}, expect)
    # What else comes back is DeepSpeed's bookkeeping, as under DeepSpeed.
    assert sorted(set(got) - set(expect)) == ["buffer_names", "ds_config", "ds_version",
                                              "global_samples"]
    return got["rank"]


@pytest.mark.parametrize("stage", [2, 3])
def test_client_state_per_rank_under_stage3_rank0s_otherwise(tmp_path, stage):
    got = run_ranks(_rank_states, 2, str(tmp_path), stage)
    assert got == ([0, 1] if stage == 3 else [0, 0])


def _multistep_resume(rank, world, save_dir):
    def multistep(opt):
        return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 5], gamma=0.1)

    a = _engine(world, 3, multistep)
    for _ in range(2):
        a.lr_scheduler.step()
    a.save_checkpoint(save_dir, tag="t")
    b = _engine(world, 3, multistep)
    b.load_checkpoint(save_dir, tag="t")
    lrs = []
    for engine in (a, b):
        lrs.append([])
        for _ in range(5):
            engine.lr_scheduler.step()
            lrs[-1].append(engine.get_lr()[0])
    return lrs, type(b.lr_scheduler.milestones).__name__


def test_multistep_scheduler_resumes_its_milestones(tmp_path):
    """MultiStepLR's milestones are a Counter of ints; as JSON keys they came back as strings
    and the resumed schedule never decayed."""
    (lrs, kind), = run_ranks(_multistep_resume, 1, str(tmp_path))
    assert kind == "Counter"
    assert lrs[1] == lrs[0] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.01])
