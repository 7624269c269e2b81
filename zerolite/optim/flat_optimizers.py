"""Optimizers that torch.optim lacks, written for flat fp32 shards."""
from __future__ import annotations

import torch


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023) with DeepSpeed's defaults (FusedLion / DeepSpeedCPULion):
    lr 1e-3, betas (0.9, 0.999), weight decay 0 — note the paper suggests (0.9, 0.99).

    Element-wise, so running it on flat shards equals running it per parameter.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = m.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss
