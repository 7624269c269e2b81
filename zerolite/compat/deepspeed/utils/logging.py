"""`deepspeed.utils.logging`: `logger` and `log_dist` (Lightning uses
`deepspeed.utils.logging.logger`)."""
from __future__ import annotations

import logging

import torch.distributed as dist

logger = logging.getLogger("zerolite")
"""DeepSpeed's `logger`; here zerolite's, so `ds_logger.setLevel(...)` (HF Trainer does) sets
the level of what zerolite logs."""


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Log `message` on the given ranks (None: rank 0; [-1]: every rank), as DeepSpeed does."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    ranks = [0] if ranks is None else list(ranks)
    if -1 in ranks or rank in ranks:
        logger.log(level, "[Rank %d] %s", rank, message)
