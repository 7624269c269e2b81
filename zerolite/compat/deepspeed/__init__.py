"""DeepSpeed's top-level API served by zerolite (`import deepspeed` under
`zerolite --as-deepspeed`). Everything here forwards to zerolite; see zerolite/compat/."""
from __future__ import annotations

import importlib

import zerolite
from zerolite import add_config_arguments, checkpointing, init_distributed
from zerolite.compat import DEEPSPEED_API_VERSION
from zerolite.compat.deepspeed._initialize import initialize
from zerolite.compat.deepspeed._refused import (
    DeepSpeedFeatureNotSupported, refused_class, refused_function,
)
from zerolite.compat.deepspeed._refused_names import refused_stubs
from zerolite.compat.deepspeed.git_version_info import git_branch, git_hash, version  # noqa: F401
from zerolite.compat.deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
from zerolite.compat.deepspeed.runtime.config import MUON_OPTIMIZER  # noqa: F401
from zerolite.compat.deepspeed.runtime.engine import (  # noqa: F401
    DeepSpeedOptimizerCallable, DeepSpeedSchedulerCallable,
)
from zerolite.compat.deepspeed.utils.init_on_device import OnDevice  # noqa: F401
from zerolite.compat.deepspeed.utils.logging import log_dist, logger  # noqa: F401
from zerolite.config.core import read_config_source as load_ds_config  # noqa: F401
from zerolite.engine import ZeroEngine as DeepSpeedEngine

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
globals().update(refused_stubs("deepspeed"))

__version__ = DEEPSPEED_API_VERSION
__version_major__, __version_minor__, __version_patch__ = map(int, __version__.split("."))
__git_hash__ = None
__git_branch__ = None
__zerolite_version__ = zerolite.__version__

# Importable names, loaded when first used (as in DeepSpeed, `deepspeed.comm` works after
# `import deepspeed` alone).
_SUBMODULES = ("zero", "accelerator", "comm", "ops", "utils", "runtime", "checkpoint", "moe", "pipe",
               "git_version_info")

init_inference = refused_function("deepspeed.init_inference",
                                  "DeepSpeed-Inference kernels and tensor-parallel inference")
tp_model_init = refused_function("deepspeed.tp_model_init", "automatic tensor parallelism")
PipelineModule = refused_class("deepspeed.PipelineModule", "pipeline parallelism")
PipelineEngine = refused_class("deepspeed.PipelineEngine", "pipeline parallelism")
InferenceEngine = refused_class("deepspeed.InferenceEngine", "DeepSpeed-Inference")
add_tuning_arguments = refused_function("deepspeed.add_tuning_arguments", "the autotuner")

__all__ = ["initialize", "init_distributed", "add_config_arguments", "checkpointing",
           "DeepSpeedEngine", "DeepSpeedFeatureNotSupported", "DeepSpeedConfig",
           "DeepSpeedConfigError", "OnDevice", "init_inference", "tp_model_init",
           "PipelineModule", "__version__", *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "dist":  # DeepSpeed's `from deepspeed import comm as dist` at top level
        return importlib.import_module(f"{__name__}.comm")
    if name == "get_accelerator":
        return importlib.import_module(f"{__name__}.accelerator").get_accelerator
    raise AttributeError(f"module 'deepspeed' (zerolite's alias) has no attribute {name!r}")
