"""`deepspeed.runtime.zero`: the same names as `deepspeed.zero`."""
from zerolite.compat.deepspeed.runtime.zero import (  # noqa: F401
    config, leaf_module_config, offload_config, partition_parameters,
)
from zerolite.compat.deepspeed.zero import (  # noqa: F401
    ZeroParamStatus, ZeroParamType, unwrap_model_for_generation,
)
from zerolite.zero import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)
