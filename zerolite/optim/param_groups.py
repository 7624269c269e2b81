"""Param groups: which group each model parameter belongs to, and the client optimizer the
engine trains.

[Note: one owner of the hyper-parameters] DeepSpeed trains the client's own optimizer object:
its ZeRO optimizer points the object's `param_groups` at the fp32 partitions, so whatever
moves `lr`, `weight_decay` or `betas` in those groups (a torch LR scheduler over the client
optimizer that only Accelerate steps, one created after `initialize`, or the user) sets what
the next step uses. zerolite does the same: `adopt_client_optimizer` re-points each of the
client's groups at this rank's fp32 master shards of that group and returns the same object,
so there is no second copy of the hyper-parameters to drift apart from the first.
"""
from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.nn as nn

from zerolite.errors import ZeroliteConfigError

logger = logging.getLogger("zerolite")


def param_groups(model: nn.Module, model_parameters) -> tuple[dict, list[dict]]:
    """(param -> group index, per-group hyper-parameters) from what the user passed: params,
    param-group dicts (e.g. a client optimizer's `param_groups`), or None (all of the model's).
    """
    if model_parameters is None:
        groups = [{"params": list(model.parameters())}]
    else:
        items = list(model_parameters)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
    own = {id(p) for p in model.parameters()}
    group_of, hparams = {}, []
    for gi, group in enumerate(groups):
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        foreign = sum(id(p) not in own for p in params)
        if foreign:
            raise ZeroliteConfigError(
                f"initialize(): param group {gi} holds {foreign} tensor(s) that are not "
                "parameters of the model (an optimizer built over another model, or one "
                "already handed to another engine?); build the optimizer or model_parameters "
                "over this model's parameters")
        for p in params:
            group_of.setdefault(p, gi)
        hparams.append({k: v for k, v in group.items() if k != "params"})
    return group_of, hparams


def adopt_client_optimizer(client: torch.optim.Optimizer,
                           masters_by_group: list[list[torch.Tensor]]) -> torch.optim.Optimizer:
    """The client optimizer itself, its groups re-pointed at the fp32 master shards
    (`masters_by_group[i]` for its group i, possibly empty on this rank); see the note above.
    Its per-parameter state is dropped: it belonged to the model's parameters."""
    if len(masters_by_group) != len(client.param_groups):
        raise ZeroliteConfigError(
            f"initialize(optimizer=...): the optimizer has {len(client.param_groups)} param "
            f"groups but {len(masters_by_group)} were sharded")
    if client.state:
        logger.warning("zerolite: initialize(optimizer=...): the optimizer already has state "
                       "for %d parameters (it was stepped); it starts afresh on the shards",
                       len(client.state))
    for group, masters in zip(client.param_groups, masters_by_group):
        group["params"] = list(masters)
    client.state = defaultdict(dict)
    return client
