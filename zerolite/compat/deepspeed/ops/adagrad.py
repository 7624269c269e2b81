"""`deepspeed.ops.adagrad`."""
from zerolite.compat.deepspeed.ops._mapped import DeepSpeedCPUAdagrad  # noqa: F401

__all__ = ["DeepSpeedCPUAdagrad"]
