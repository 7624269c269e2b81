"""`deepspeed.ops.adam`."""
from zerolite.optim.deepspeed_optimizers import DeepSpeedCPUAdam, FusedAdam  # noqa: F401

__all__ = ["FusedAdam", "DeepSpeedCPUAdam"]

from zerolite.compat.deepspeed._refused_names import refused_stubs  # noqa: E402

globals().update(refused_stubs("deepspeed.ops.adam"))
