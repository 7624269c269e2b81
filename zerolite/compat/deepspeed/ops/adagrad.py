"""`deepspeed.ops.adagrad`."""
from zerolite.optim.deepspeed_optimizers import DeepSpeedCPUAdagrad  # noqa: F401

__all__ = ["DeepSpeedCPUAdagrad"]
