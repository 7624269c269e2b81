"""`deepspeed.utils.logging`: `logger` and `log_dist` (Lightning uses
`deepspeed.utils.logging.logger`)."""
from __future__ import annotations

import logging

import torch.distributed as dist

logger = logging.getLogger("zerolite")
"""DeepSpeed's `logger`; here zerolite's, so `ds_logger.setLevel(...)` (HF Trainer does) sets
the level of what zerolite logs."""


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}
_logged_once: set = set()


def log_dist_once(message: str, ranks=None, level: int = logging.INFO) -> None:
    """log_dist, but each distinct (message, ranks, level) only once per process."""
    key = (message, tuple(ranks) if ranks is not None else None, level)
    if key not in _logged_once:
        _logged_once.add(key)
        log_dist(message, ranks, level)


def set_log_level_from_string(log_level_str: str, custom_logger=None) -> None:
    """Set `logger`'s level (and its handlers') from "debug", "info", "warning", ..."""
    if log_level_str.lower() not in _LEVELS:
        raise ValueError(f"{log_level_str} is not one of the `logging` levels {list(_LEVELS)}")
    target = logger if custom_logger is None else custom_logger
    target.setLevel(_LEVELS[log_level_str.lower()])
    for handler in target.handlers:
        handler.setLevel(_LEVELS[log_level_str.lower()])


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Log `message` on the given ranks (None: rank 0; [-1]: every rank), as DeepSpeed does."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    ranks = [0] if ranks is None else list(ranks)
    if -1 in ranks or rank in ranks:
        logger.log(level, "[Rank %d] %s", rank, message)
