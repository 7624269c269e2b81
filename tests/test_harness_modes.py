"""The multi-rank harness picks fork + gloo on CPU and spawn (+ NCCL or gloo) on CUDA."""
import torch
import torch.distributed as dist

from zerolite.testing import multiprocess
from zerolite.testing.multiprocess import harness_mode, run_ranks


def test_mode_per_machine(monkeypatch):
    if not torch.cuda.is_available():
        assert harness_mode(2) == ("fork", "gloo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert harness_mode(1) == ("spawn", "nccl")
    assert harness_mode(2) == ("spawn", "gloo")  # two ranks share the one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert harness_mode(4) == ("spawn", "nccl")


def _rank_info(rank, world):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return dist.get_backend(), t.item(), multiprocess.__name__


def test_spawned_ranks_join():
    # The spawn start method (what CUDA runs use), exercised on CPU with gloo (~7 s: each
    # rank imports torch afresh). Failure handling is the parent's, shared with fork.
    assert run_ranks(_rank_info, 2, start_method="spawn") == [
        ("gloo", 3.0, "zerolite.testing.multiprocess")] * 2
