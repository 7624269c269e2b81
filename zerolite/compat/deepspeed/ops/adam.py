"""`deepspeed.ops.adam`."""
from zerolite.compat.deepspeed.ops._mapped import DeepSpeedCPUAdam, FusedAdam  # noqa: F401

__all__ = ["FusedAdam", "DeepSpeedCPUAdam"]
