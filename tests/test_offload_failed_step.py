"""A failed NVMe-offload step must not let its queued I/O land after step() raised.

The race this pins down: the step's write-behind runs on an I/O thread. If step() raised
while later writes of the same step were still queued, those writes went to the very slot a
following state assignment (checkpoint load, `optimizer.state[p] = ...`) writes and then
commits, so the failed step's values silently replaced the assigned ones. Queued writes are
slowed down here, so the old behaviour fails every time instead of once in many runs.
"""
import threading
import time

import pytest
import torch

from zerolite.errors import ZeroliteError
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer
from zerolite.offload.swap_files import SwapFiles


def test_state_assigned_after_a_failed_step_is_not_overwritten_by_its_queued_writes(
        tmp_path, monkeypatch):
    torch.manual_seed(0)
    big, small = torch.nn.Parameter(torch.randn(1000)), torch.nn.Parameter(torch.randn(37))
    opt = ChunkedOffloadOptimizer(torch.optim.AdamW([big, small], lr=0.01),
                                  nvme_path=str(tmp_path), rank=0, sub_group_size=100)
    for p in (big, small):
        p.grad = torch.ones_like(p)
    opt.step()  # commits state; the next step writes the other slot of every chunk

    real_write, calls, failed = SwapFiles.write, [0], threading.Event()

    def write(self, *args):
        calls[0] += 1
        if calls[0] == 3:  # the second chunk's first entry: ten chunks are still to come
            failed.set()
            raise OSError(5, "Input/output error")
        if failed.is_set() and threading.current_thread().name.startswith("zerolite-offload"):
            time.sleep(0.05)  # a slow disk: queued writes lag behind the main thread
        return real_write(self, *args)

    monkeypatch.setattr(SwapFiles, "write", write)
    with pytest.raises(OSError):
        opt.step()
    with pytest.raises(ZeroliteError, match="failed half-way"):
        opt.state[small]
    good = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(37),
            "exp_avg_sq": torch.full((37,), 7.0)}
    opt.state[small] = good  # written by this thread while the slow patch is still active
    time.sleep(0.05 * 25)  # long enough for every queued write of the failed step to land
    got = opt.state[small]
    assert torch.equal(got["exp_avg_sq"], good["exp_avg_sq"]), got["exp_avg_sq"][:3]
    assert torch.equal(got["exp_avg"], good["exp_avg"])
