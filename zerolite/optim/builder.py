"""Build the optimizer that updates the fp32 master shards.

The optimizer sees one flat fp32 tensor per (unit, param group); it never sees the model's
own parameters. Element-wise optimizers (Adam, AdamW, SGD, Adagrad, Lion) give exactly the
update they would give per parameter.
"""
from __future__ import annotations

import inspect

import torch

from zerolite.errors import ZeroliteConfigError


def _optimizer_class(type_name: str, params: dict):
    from zerolite.optim import flat_optimizers

    name = type_name.lower()
    # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (FusedAdam semantics).
    if name == "adam":
        return torch.optim.AdamW if params.get("adam_w_mode", True) else torch.optim.Adam
    if name == "lamb":
        raise ZeroliteConfigError(
            "optimizer.type: 'Lamb' is not supported yet: its per-parameter trust ratio needs "
            "each parameter's norm across shards; use Adam, AdamW, SGD, Adagrad or Lion")
    table = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
             "lion": flat_optimizers.Lion}
    if name not in table:
        raise ZeroliteConfigError(
            f"optimizer.type: {type_name!r} is not supported; choose one of "
            "Adam, AdamW, SGD, Adagrad, Lion, or pass a torch.optim optimizer")
    return table[name]


def _accepted_kwargs(cls, params: dict) -> dict:
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    out = {k: (tuple(v) if k == "betas" else v) for k, v in params.items() if k in accepted}
    return out


def build_optimizer(opt_type: str | None, opt_params: dict | None, client_optimizer,
                    master_groups: list[dict]) -> torch.optim.Optimizer | None:
    """Optimizer over `master_groups` ([{"params": [fp32 shards], **group hparams}, ...]).

    `client_optimizer` may be a torch.optim.Optimizer built over the model's parameters (it is
    rebuilt over the shards with the same class and hyper-parameters), a callable taking the
    param groups, or None (then `opt_type`/`opt_params` from the config are used).
    """
    if client_optimizer is not None:
        if isinstance(client_optimizer, torch.optim.Optimizer):
            cls = type(client_optimizer)
            return cls(master_groups, **_accepted_kwargs(cls, client_optimizer.defaults))
        if callable(client_optimizer):
            opt = client_optimizer(master_groups)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError("initialize(optimizer=callable): the callable must return a "
                                f"torch.optim.Optimizer, got {type(opt).__name__}")
            return opt
        raise TypeError("initialize(optimizer=...) must be a torch.optim.Optimizer or a callable "
                        f"taking param groups, got {type(client_optimizer).__name__}")
    if opt_type is None:
        return None
    # DeepSpeed's defaults (e.g. weight_decay 0.0, not torch AdamW's 0.01) are filled in by
    # zerolite.config, which also validated every value.
    params = dict(opt_params or {})
    cls = _optimizer_class(opt_type, params)
    return cls(master_groups, **_accepted_kwargs(cls, params))
