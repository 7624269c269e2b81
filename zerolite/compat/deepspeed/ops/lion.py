"""`deepspeed.ops.lion`."""
from zerolite.optim.deepspeed_optimizers import DeepSpeedCPULion, FusedLion  # noqa: F401

__all__ = ["DeepSpeedCPULion", "FusedLion"]
