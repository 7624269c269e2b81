"""The change of basis of benchmarks/sparse_adam_study.py: an orthonormal, invertible chunked
DCT, and a per-chunk selection that takes exactly its quota from every chunk."""
import math

import torch

from benchmarks.sparse_adam_study import ChunkDCT


def test_chunk_dct_is_orthonormal_and_inverts():
    numels = [384 * 128, 128, 100, 7]  # chunk 128, 128, 100 (divisor), 7
    dct = ChunkDCT(numels, 128)
    assert dct.chunks == [128, 128, 100, 7]
    x = torch.randn(sum(numels), generator=torch.Generator().manual_seed(0))
    coeffs = dct.encode(x)
    assert math.isclose(coeffs.norm().item(), x.norm().item(), rel_tol=1e-5)
    torch.testing.assert_close(dct.decode(coeffs), x, rtol=0, atol=1e-5)
    # a constant chunk has one coefficient only (the DC term)
    const = dct.encode(torch.ones(sum(numels)))[:128]
    assert const[1:].abs().max() < 1e-5 and const[0] > 1


def test_per_chunk_selection_takes_the_largest_of_every_chunk():
    dct = ChunkDCT([64 * 4, 10], 64)
    acc = torch.randn(266, generator=torch.Generator().manual_seed(1))
    mask = dct.top_per_chunk(acc, 2 / 64)
    for c in range(int(dct.chunk_id.max()) + 1):
        in_chunk = dct.chunk_id == c
        chosen = acc.abs()[in_chunk & mask]
        assert chosen.numel() == (2 if c < 4 else 1)  # ceil(2/64 x 64), ceil(2/64 x 10)
        assert chosen.min() >= acc.abs()[in_chunk & ~mask].max()
