"""`deepspeed.zero`: zero.Init, GatheredParameters and the external-parameter calls."""
from zerolite.zero import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)
from zerolite.zero.param_status import ZeroParamStatus  # noqa: F401
from zerolite.zero.sliced_param import is_partitioned as _is_partitioned


def is_zero_param(param) -> bool:
    """True for a parameter partitioned by zero.Init or the engine (DeepSpeed: `ds_id` set)."""
    return _is_partitioned(param) or hasattr(param, "zl_handle")


__all__ = ["Init", "GatheredParameters", "register_external_parameter",
           "unregister_external_parameter", "is_zero_param", "ZeroParamStatus"]

from zerolite.compat.deepspeed._refused_names import refused_stubs  # noqa: E402

globals().update(refused_stubs("deepspeed.zero"))
