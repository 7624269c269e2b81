"""Shared by the offload tests: bitwise run comparison and a rank killed mid-step."""
import os

import torch

from zerolite.offload.swap_files import SwapFiles
from zerolite.testing.reference import train_engine

from gpt_cases import batches


def assert_same_run(a, b):
    """a, b = (losses, full state dict, ...): equal bitwise."""
    assert a[0] == b[0]  # losses, bitwise
    assert a[1].keys() == b[1].keys()
    for name, value in a[1].items():
        assert torch.equal(value, b[1][name]), name


def train_then_die_mid_step(engine, rank, world, save_dir, steps, half, kill_at_write):
    """Train `half` steps, checkpoint, then train on until rank 1's `kill_at_write`-th swap
    file write, where it dies as a SIGKILL would: no cleanup, files left as they are."""
    train_engine(engine, batches(steps)[:half], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    writes, real_write = [0], SwapFiles.write

    def dying_write(self, *args):
        writes[0] += 1
        if rank == 1 and writes[0] == kill_at_write:
            os._exit(9)
        return real_write(self, *args)

    SwapFiles.write = dying_write
    train_engine(engine, batches(steps)[half:], rank, world)
