"""`deepspeed.initialize` under the alias: zerolite.initialize after translating the values
DeepSpeed's own config accepts but zerolite's strict one spells differently."""
from __future__ import annotations

import copy
import math

import zerolite

NEVER = 2 ** 62
"""steps_per_print for "never print" (DeepSpeed takes float("inf"); Accelerate sets it)."""


def _translate(config):
    if not isinstance(config, dict):
        return config
    spp = config.get("steps_per_print")
    if isinstance(spp, float) and math.isinf(spp) and spp > 0:
        config = copy.copy(config)
        config["steps_per_print"] = NEVER
    return config


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=29500, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, config_params=None, **kwargs):
    """DeepSpeed's signature; returns (engine, optimizer, training_dataloader, lr_scheduler)."""
    return zerolite.initialize(args=args, model=model, optimizer=optimizer,
                               model_parameters=model_parameters, training_data=training_data,
                               lr_scheduler=lr_scheduler, distributed_port=distributed_port,
                               mpu=mpu, dist_init_required=dist_init_required,
                               collate_fn=collate_fn, config=_translate(config),
                               config_params=_translate(config_params), **kwargs)
