"""`deepspeed.runtime`: engine, lr_schedules, zero.partition_parameters, activation checkpointing.
Imported together, as DeepSpeed does (Accelerate reads `deepspeed.runtime.lr_schedules`
after a bare `import deepspeed`)."""
from zerolite.compat.deepspeed.runtime import (  # noqa: F401
    activation_checkpointing, config, config_utils, engine, lr_schedules, zero,
)
