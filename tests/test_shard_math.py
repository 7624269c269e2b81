"""Partition math and the one full-flat gather against the naive single-process split."""
import pytest
import torch

from zerolite.comm.collectives import gather_full_flat
from zerolite.testing.multiprocess import run_ranks
from zerolite.zero.flat_param import FlatParam
from zerolite.zero.shard_math import overlap, rank_range, reference_shards, shard_numel


@pytest.mark.parametrize("numel,parts", [(1, 1), (10, 1), (10, 3), (12, 4), (3, 4), (0, 2)])
def test_rank_ranges_match_reference_split(numel, parts):
    full = torch.arange(1, numel + 1, dtype=torch.float32)
    shards = reference_shards(full, parts)
    n = shard_numel(numel, parts)
    padded = torch.cat(shards)
    assert padded.numel() == n * parts >= numel
    for r in range(parts):
        lo, hi = rank_range(r, n)
        assert torch.equal(padded[lo:hi], shards[r])
        lo, hi = rank_range(r, n, limit=numel)
        assert torch.equal(full[lo:hi], shards[r][:hi - lo])
        assert not shards[r][hi - lo:].any()  # padding only past the value


def test_overlap():
    assert overlap((0, 5), (3, 9)) == (3, 5)
    assert overlap((0, 3), (3, 9)) is None
    assert overlap((4, 6), (0, 10)) == (4, 6)


def _gather_and_flat(rank, world):
    full = torch.arange(1, 12, dtype=torch.float32) * 0.5  # 11 elements: padded on the last
    gathered = gather_full_flat(reference_shards(full, world)[rank].clone(), world)
    p = torch.nn.Parameter(full.view(1, 11).clone())
    flat = FlatParam([(("w",), p)], rank=rank, partitions=world,
                     compute_dtype=torch.float32, group_index=0)
    return gathered, flat.shard.clone(), flat.local_shard_of(gathered).clone()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_gather_full_flat_and_flat_shards_match_reference(world):
    full = torch.arange(1, 12, dtype=torch.float32) * 0.5
    want = reference_shards(full, world)
    for rank, (gathered, shard, sliced) in enumerate(run_ranks(_gather_and_flat, world)):
        assert torch.equal(gathered, torch.cat(want))
        assert torch.equal(shard, want[rank])
        assert torch.equal(sliced, want[rank])
