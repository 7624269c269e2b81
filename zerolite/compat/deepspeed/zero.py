"""`deepspeed.zero`: zero.Init, GatheredParameters, the external-parameter calls,
`unwrap_model_for_generation`, and the values of `param.ds_status` / `param.ds_param_type`."""
from contextlib import contextmanager

from zerolite.engine import ZeroEngine
from zerolite.errors import ZeroliteConfigError
from zerolite.zero import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)
from zerolite.zero.param_status import ZeroParamStatus, ZeroParamType  # noqa: F401
from zerolite.zero.sliced_param import is_partitioned as _is_partitioned


def is_zero_param(param) -> bool:
    """True for a parameter partitioned by zero.Init or the engine (DeepSpeed: `ds_id` set)."""
    return _is_partitioned(param) or hasattr(param, "zl_handle")


@contextmanager
def unwrap_model_for_generation(model):
    """DeepSpeed's `deepspeed.runtime.zero.unwrap_model_for_generation(engine)`: every parameter
    gathered once and the units' module hooks removed for the block, so `generate` runs as on
    an ordinary model instead of gathering and releasing each unit per token; the hooks come
    back (and the prefetch trace is recorded afresh) when it ends. Yields `model`."""
    if not isinstance(model, ZeroEngine):
        raise ZeroliteConfigError(
            "unwrap_model_for_generation(model): expected the engine deepspeed.initialize "
            f"returned, got {type(model).__name__}")
    with GatheredParameters(list(model.module.parameters())):
        with model.sharded.parameter_offload.unhooked():
            yield model


__all__ = ["Init", "GatheredParameters", "register_external_parameter",
           "unregister_external_parameter", "is_zero_param", "ZeroParamStatus", "ZeroParamType",
           "unwrap_model_for_generation"]

from zerolite.compat.deepspeed._refused_names import refused_stubs  # noqa: E402

globals().update(refused_stubs("deepspeed.zero"))
