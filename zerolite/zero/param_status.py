"""`ZeroParamStatus` and `param.ds_status`: whether a sharded parameter's full value is here.

DeepSpeed's enum, with DeepSpeed's values, for code that checks a ZeRO-3 parameter before
reading it (TRL's fused loss: `if p.ds_status != ZeroParamStatus.AVAILABLE: gather`):

    AVAILABLE      the full value is in `p.data` (the unit is gathered; a zero.Init parameter
                   inside GatheredParameters)
    NOT_AVAILABLE  only this rank's shard exists (`p.data` has 0 elements)
    INFLIGHT       its all-gather has been issued and not waited for yet (a prefetch)

The status is an attribute written at every transition (unit.py for engine parameters,
sliced_param.py for zero.Init ones), not computed on read: a parameter cannot carry a
property, and the writes happen once per unit gather or release.
"""
from __future__ import annotations

import enum


class ZeroParamStatus(enum.Enum):
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


class ZeroParamType(enum.Enum):
    """DeepSpeed's `param.ds_param_type`: every parameter zero.Init or the engine partitions is
    PARTITIONED; NORMAL and REMOTE exist for code that compares against them."""
    NORMAL = 1
    PARTITIONED = 2
    REMOTE = 3


def mark(params, status: ZeroParamStatus) -> None:
    for p in params:
        p.ds_status = status
