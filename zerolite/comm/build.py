"""Pick the gradient reducer and parameter gatherer a config asks for."""
from __future__ import annotations

import torch

from zerolite.comm.reducers import GradReducer, ParamGatherer

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def build_grad_reducer(config, world_size: int) -> GradReducer:
    comm_dtype = _DTYPES[config.communication_data_type] if config.communication_data_type else None
    predivide = config.gradient_predivide_factor if config.prescale_gradients else 1.0
    return GradReducer(world_size, comm_dtype=comm_dtype, predivide=predivide)


def build_param_gatherer(config) -> ParamGatherer:
    return ParamGatherer()
