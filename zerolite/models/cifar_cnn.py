"""The DeepSpeed CIFAR-10 tutorial's small CNN, and synthetic CIFAR-shaped batches for it.

The model returns logits; the loss is the caller's (the tutorial computes
`CrossEntropyLoss()(model(x), y)` on the model's own dtype, bf16 in a bf16 run).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class CifarNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def cifar_batches(steps: int, global_batch: int, seed: int = 0):
    """(images, labels) batches a CNN can learn: each class has its own fixed mean image
    (a random 3x32x32 pattern), and each sample is that pattern plus unit noise."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(10, 3, 32, 32, generator=g)
    out = []
    for _ in range(steps):
        y = torch.randint(0, 10, (global_batch,), generator=g)
        x = means[y] * 0.5 + torch.randn(global_batch, 3, 32, 32, generator=g)
        out.append((x, y))
    return out
