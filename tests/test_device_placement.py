"""Device placement as DeepSpeed does it: engine.device, the module (and zero.Init slices)
moved there in initialize, flats/shards/masters on it, helpers creating tensors on it."""
import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.comm import process_group
from zerolite.device.placement import move_module, place_module
from zerolite.optim.grad_norm import sum_of_squares
from zerolite.testing.multiprocess import run_ranks
from zerolite.zero.sliced_param import partition_info

from gpt_cases import ds_config, tiny_gpt


def _engine_tensors(rank, world):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    flats = engine.sharded.flats
    devices = {str(t.device) for f in flats for t in (f.shard, f.master, f.full)
               if t is not None}
    return str(engine.device), devices, engine.device_layer.kind


def test_engine_device_on_cpu():
    device, devices, kind = run_ranks(_engine_tensors, 1)[0]
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert device == expected and devices == {expected} and kind == expected[:4]


class _WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("running", torch.ones(3))


# Note: this CPU build has no second device a Parameter's .data can move to (meta tensors
# cannot back a CPU Parameter), so the move logic is checked with a float64 cast standing
# in for the device copy: same code path, observable result.
def _to_double(t):
    return t.double()


def test_move_module_moves_params_grads_buffers():
    m = _WithBuffer()
    weight = m.lin.weight
    m.lin.weight.grad = torch.ones_like(m.lin.weight)
    move_module(m, _to_double)
    assert all(t.dtype == torch.float64 for t in (m.lin.weight, m.lin.bias, m.running,
                                                   m.lin.weight.grad))
    assert m.lin.weight is weight  # the user's Parameter object is kept
    place_module(m, "cpu")  # already there: nothing changes
    assert m.lin.weight is weight and m.lin.weight.dtype == torch.float64


def _init_then_place(rank, world):
    with zerolite.zero.Init():
        model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    before = [p.zl_partitioned.local.clone() for p in model.parameters()]
    move_module(model, _to_double, partition_info)
    out = []
    for p, old in zip(model.parameters(), before):
        info = p.zl_partitioned
        out.append((torch.equal(info.local, old.double()), info.local.dtype, info.local.numel(),
                    p.ds_tensor is info.local, p.dtype, tuple(p.ds_shape), p.numel(),
                    p.untyped_storage().nbytes()))
    return out


def test_move_module_moves_zero_init_slices_not_placeholders():
    # The slice moves with its values; the parameter's own data stays empty (module.to()
    # would move the empty tensor and leave the slice behind).
    for rank_out in run_ranks(_init_then_place, 2):
        for same_values, local_dtype, numel, same, dtype, shape, p_numel, nbytes in rank_out:
            assert same_values and same and local_dtype == dtype == torch.float64
            assert numel == -(-torch.Size(shape).numel() // 2)
            assert p_numel == 0 and nbytes == 0


def test_no_grads_norm_lives_on_the_given_device():
    assert sum_of_squares([], device="meta").device.type == "meta"
    assert sum_of_squares([]).device.type == "cpu"


def test_default_backend_mixes_gloo_and_nccl_on_cuda(monkeypatch):
    if not torch.cuda.is_available():
        assert process_group.default_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert process_group.default_backend() == "cpu:gloo,cuda:nccl"
