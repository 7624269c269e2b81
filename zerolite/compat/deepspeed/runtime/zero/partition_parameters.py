"""`deepspeed.runtime.zero.partition_parameters`: Init, GatheredParameters, ZeroParamStatus (the
values of `param.ds_status`, which TRL checks), ZeroParamType (`param.ds_param_type`) and the hooks Transformers patches around
`zero.Init`."""
import torch

from zerolite.compat.deepspeed.accelerator import get_accelerator  # noqa: F401
from zerolite.zero import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)
from zerolite.zero.param_status import ZeroParamStatus, ZeroParamType  # noqa: F401

_orig_torch_arange = torch.arange
_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    """[Note: nothing to wrap] DeepSpeed's zero.Init rewrites tensor constructors to the
    target dtype/device; zerolite's keeps the dtypes the model asks for (the engine builds fp32
    masters from them), so the constructors are returned as they are. Transformers swaps this
    function to exempt torch.arange; that stays a no-op here."""
    return fn


__all__ = ["Init", "GatheredParameters", "ZeroParamStatus", "ZeroParamType", "register_external_parameter",
           "unregister_external_parameter",
           "zero_wrapper_for_fp_tensor_constructor", "get_accelerator"]
