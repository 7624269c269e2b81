"""Byte-level training text that exists on every machine with Python: the standard
library's own .py sources. No downloads."""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch.utils.data import Dataset


def stdlib_bytes(max_bytes: int = 4_000_000) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    if not chunks:
        raise FileNotFoundError(f"no .py files under {root}")
    return b"".join(chunks)[:max_bytes]


class ByteWindows(Dataset):
    """Fixed windows of `seq_len + 1` bytes at shuffled offsets; item = (inputs, targets)."""

    def __init__(self, data: bytes, seq_len: int, num_windows: int, seed: int = 0):
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        if len(self.tokens) <= seq_len + 1:
            raise ValueError(f"need more than {seq_len + 1} bytes of text, got {len(self.tokens)}")
        g = torch.Generator().manual_seed(seed)
        self.offsets = torch.randint(0, len(self.tokens) - seq_len - 1, (num_windows,), generator=g)
        self.seq_len = seq_len

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        window = self.tokens[self.offsets[i]: self.offsets[i] + self.seq_len + 1]
        return window[:-1], window[1:]
