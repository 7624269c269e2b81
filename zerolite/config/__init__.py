"""DeepSpeed JSON config -> typed, validated :class:`ZeroConfig`.

    from zerolite.config import load_config
    cfg = load_config("configs/zero3_cpu.json", world_size=4)

Key names and defaults follow DeepSpeed; every error is a one-line ``ZeroliteConfigError`` naming
the JSON path, the bad value and what is expected. Unknown keys produce one warning.
"""

from zerolite.errors import ZeroliteConfigError

from ._util import TORCH_DTYPES
from .batch import derive_batch
from .core import (
    ZeroConfig, ZeroliteConfigWarning, add_config_arguments, load_config, read_json,
)
from .optim import OPTIMIZER_PARAMS, SCHEDULER_PARAMS, OptimizerConfig, SchedulerConfig
from .sections import (
    ActivationCheckpointingConfig, Bf16Config, DataTypesConfig, Fp16Config, SparseGradientsConfig,
    TorchAutocastConfig, ZeroliteExtrasConfig, ZeroOptimizationConfig,
)
from .support import KEY_SUPPORT, accepted_ignored_keys

__all__ = [
    "KEY_SUPPORT", "OPTIMIZER_PARAMS", "SCHEDULER_PARAMS", "TORCH_DTYPES",
    "ActivationCheckpointingConfig", "Bf16Config", "DataTypesConfig", "Fp16Config",
    "OptimizerConfig", "SchedulerConfig", "SparseGradientsConfig", "TorchAutocastConfig",
    "ZeroConfig", "ZeroOptimizationConfig", "ZeroliteConfigError", "ZeroliteConfigWarning",
    "ZeroliteExtrasConfig", "accepted_ignored_keys", "add_config_arguments", "derive_batch",
    "load_config", "read_json",
]
