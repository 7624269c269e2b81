"""`deepspeed.ops.lion`."""
from zerolite.compat.deepspeed.ops._mapped import DeepSpeedCPULion, FusedLion  # noqa: F401

__all__ = ["DeepSpeedCPULion", "FusedLion"]
