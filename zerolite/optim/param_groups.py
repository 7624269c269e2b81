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
    initial = [_initial_state(client.state, group["params"]) for group in client.param_groups]
    if client.state and not all(t is not None for t in initial):
        logger.warning("zerolite: initialize(optimizer=...): the optimizer already has state "
                       "for %d parameters (it was stepped); it starts afresh on the shards",
                       len(client.state))
    fresh = defaultdict(dict)
    for group, masters, template in zip(client.param_groups, masters_by_group, initial):
        group["params"] = list(masters)
        for master in masters if template else ():
            fresh[master] = {k: (v.clone() if v.dim() == 0 else torch.full_like(master, v.item()))
                             if isinstance(v, torch.Tensor) else v for k, v in template.items()}
    client.state = fresh
    return client


def _initial_state(state, params) -> dict | None:
    """The state an optimizer made in its constructor for `params`, as one template, or None.

    [Note: state made in __init__] Some optimizers create per-parameter state eagerly (torch
    2.11's Adagrad: `sum` filled with initial_accumulator_value, `step` 0) and later expect it
    in step(). Such state is the same constant for every parameter of a group, so it is
    rebuilt for each master shard; state that a step changed is not (it is dropped)."""
    entries = [state[p] for p in params if p in state]
    if not entries or len(entries) != len(params):
        return None
    template = {}
    for key, value in entries[0].items():
        if isinstance(value, torch.Tensor):
            flat = value.detach().reshape(-1)
            if flat.numel() == 0 or not torch.all(flat == flat[0]):
                return None
            if key == "step" and float(flat[0]) != 0:
                return None
            template[key] = flat[0].clone() if value.dim() == 0 else flat[:1].clone()
        else:
            template[key] = value
    for entry in entries:
        if entry.keys() != template.keys():
            return None
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and not torch.all(
                    value.detach().reshape(-1) == template[key].reshape(-1)[0]):
                return None
    return {k: (v.reshape(()) if isinstance(v, torch.Tensor) and k == "step" else v)
            for k, v in template.items()}
