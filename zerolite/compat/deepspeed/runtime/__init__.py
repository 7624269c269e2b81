"""`deepspeed.runtime`: engine, lr_schedules, zero.partition_parameters, activation checkpointing,
base_optimizer.
Imported together, as DeepSpeed does (Accelerate reads `deepspeed.runtime.lr_schedules`
after a bare `import deepspeed`)."""
from zerolite.compat.deepspeed.runtime import (  # noqa: F401
    activation_checkpointing, base_optimizer, config, config_utils, engine, lr_schedules, zero,
)
