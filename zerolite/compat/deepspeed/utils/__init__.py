"""`deepspeed.utils`: the logger, log_dist, groups, set_z3_leaf_modules, zero_to_fp32 and the
tensor-fragment API (safe_get_full_fp32_param, ...)."""
from __future__ import annotations

from zerolite.compat.deepspeed.utils import groups, logging, tensor_fragment, zero_to_fp32  # noqa: F401
from zerolite.compat.deepspeed.utils import z3_leaf_module as _leaf
from zerolite.compat.deepspeed.utils.groups import (  # noqa: F401
    get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size,
    get_model_parallel_rank, get_model_parallel_world_size, get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from zerolite.compat.deepspeed.utils.init_on_device import OnDevice  # noqa: F401
from zerolite.compat.deepspeed.utils.logging import (  # noqa: F401
    log_dist, log_dist_once, logger, set_log_level_from_string,
)
from zerolite.compat.deepspeed.utils.module_utils import (  # noqa: F401
    RepeatingLoader, recursive_getattr, recursive_setattr,
)
from zerolite.compat.deepspeed.utils.tensor_fragment import (  # noqa: F401
    safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
    safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
    safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
    safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized,
)
from zerolite.compat.deepspeed.utils.z3_leaf_module import (  # noqa: F401
    get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter,
)
# Note: as in DeepSpeed, `deepspeed.utils.z3_leaf_module` is the function (the import above
# shadows the submodule of the same name, which stays importable by its full path).


__all__ = ["logger", "log_dist", "logging", "groups", "zero_to_fp32", "tensor_fragment", "OnDevice",
           *tensor_fragment.__all__, *_leaf.__all__]

from zerolite.compat.deepspeed._refused_names import refused_stubs  # noqa: E402

globals().update(refused_stubs("deepspeed.utils"))
