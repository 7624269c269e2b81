"""`deepspeed.runtime.zero`: the same names as `deepspeed.zero`."""
from zerolite.compat.deepspeed.runtime.zero import partition_parameters  # noqa: F401
from zerolite.zero.param_status import ZeroParamStatus  # noqa: F401
from zerolite.zero import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)
