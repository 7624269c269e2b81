"""Build the optimizer that updates the fp32 master shards.

The optimizer sees one flat fp32 tensor per (unit, param group); it never sees the model's
own parameters. Element-wise optimizers (Adam, AdamW, SGD, Adagrad, Lion) give exactly the
update they would give per parameter.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch

from zerolite.errors import ZeroliteConfigError
from zerolite.optim.param_groups import adopt_client_optimizer

logger = logging.getLogger("zerolite")


ELEMENTWISE_TORCH_OPTIMIZERS = ("SGD", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta",
                                "Rprop", "ASGD")
"""torch.optim classes whose update of an element reads only that element (and step
counts), so stepping them over flat shards is exact."""


def _optimizer_class(type_name: str, params: dict, cpu_optimizer: bool):
    """The class DeepSpeed's engine builds for `optimizer.type` (engine.py,
    `_configure_basic_optimizer`): Adam/AdamW are `deepspeed.ops.adam.FusedAdam`, or
    `DeepSpeedCPUAdam` when the optimizer is offloaded, or torch's own class with
    `"torch_adam": true`; Adagrad and Lion likewise. Programs check these with isinstance."""
    from zerolite.optim import deepspeed_optimizers as ds

    name = type_name.lower()
    if name in ("adam", "adamw"):
        # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (config/optim.py keeps
        # adam_w_mode true for "AdamW").
        if params.get("torch_adam", False):
            return torch.optim.AdamW if params.get("adam_w_mode", True) else torch.optim.Adam
        return ds.DeepSpeedCPUAdam if cpu_optimizer else ds.FusedAdam
    if name == "lamb":
        raise ZeroliteConfigError(
            "optimizer.type: 'Lamb' is not supported yet: its per-parameter trust ratio needs "
            "each parameter's norm across shards; use Adam, AdamW, SGD, Adagrad or Lion")
    if name == "adagrad":
        return ds.DeepSpeedCPUAdagrad if cpu_optimizer else torch.optim.Adagrad
    if name == "lion":
        return ds.DeepSpeedCPULion if cpu_optimizer else ds.FusedLion
    # Any other name DeepSpeed takes from torch.optim; zerolite.config accepts the element-wise
    # ones (OPTIMIZER_PARAMS).
    torch_names = {n.lower(): n for n in ELEMENTWISE_TORCH_OPTIMIZERS}
    if name not in torch_names:
        raise ZeroliteConfigError(
            f"optimizer.type: {type_name!r} is not one zerolite builds; name another in the "
            "config or pass a torch.optim optimizer")
    return getattr(torch.optim, torch_names[name])


def accepted_kwargs(cls, params: dict) -> dict:
    params = dict(params)
    if "adam_w_mode" in params:  # DeepSpeedCPUAdam spells it adamw_mode
        params.setdefault("adamw_mode", params["adam_w_mode"])
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params",
                                                                    "model_params"}
    out = {k: (tuple(v) if k == "betas" else v) for k, v in params.items() if k in accepted}
    return out


@dataclass(frozen=True)
class ZeroOptimizerRules:
    """Which optimizer classes a ZeRO stage may train, from the config.

    [Note: why untested optimizers are refused] zerolite steps the optimizer over flat
    shards, not over the parameters, at every stage: an element-wise update (Adam, SGD,
    Adagrad, Lion, ...) is the same there, but one that reads a parameter's shape or its whole
    norm (Adafactor's factored moments, LAMB's or LARS's trust ratio, Muon's
    orthogonalisation) silently computes something else. At stages 1-3 DeepSpeed refuses
    every class outside its tested list (an exact type check: a subclass is untested too)
    unless the config says "zero_allow_untested_optimizer": true, and so does zerolite, so a
    program behaves as under DeepSpeed. At stage 0 DeepSpeed steps the real parameters and
    takes any optimizer; zerolite takes the element-wise torch classes and refuses the rest
    unless that same key is true, rather than train them differently. With the optimizer
    offloaded, DeepSpeed also refuses a class other than DeepSpeedCPUAdam / DeepSpeedCPULion
    unless "zero_force_ds_cpu_optimizer": false (a program's optimizer; one the config names is
    built as the offload needs), and so does zerolite.
    """

    stage: int = 0
    allow_untested: bool = False
    force_ds_cpu_optimizer: bool = True

    def check(self, cls: type, cpu_optimizer: bool, client: bool) -> None:
        """`client`: the program's optimizer (or its callable's), not one the config built."""
        from zerolite.optim import deepspeed_optimizers as ds
        from zerolite.optim.flat_optimizers import Lion

        if client and cpu_optimizer and self.force_ds_cpu_optimizer and not issubclass(
                cls, (ds.DeepSpeedCPUAdam, ds.DeepSpeedCPULion)):
            raise ZeroliteConfigError(
                f"zero_optimization.offload_optimizer: the optimizer is {_name(cls)}, not "
                "deepspeed.ops.adam.DeepSpeedCPUAdam or deepspeed.ops.lion.DeepSpeedCPULion, "
                "and DeepSpeed refuses that with the optimizer offloaded; use one of those, "
                "set an \"optimizer\" in the config, or add \"zero_force_ds_cpu_optimizer\": "
                "false to the config to train this one on the host")
        if self.allow_untested:
            return
        tested = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, ds.FusedAdam,
                  ds.DeepSpeedCPUAdam, ds.DeepSpeedCPUAdagrad, ds.DeepSpeedCPULion,
                  ds.FusedLion)
        if self.stage > 0 and cls not in tested:
            raise ZeroliteConfigError(
                f"optimizer: {_name(cls)} is not one DeepSpeed has tested with ZeRO stage "
                f"{self.stage} (torch Adam, AdamW, Adagrad, DeepSpeed's FusedAdam, "
                "DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, FusedLion, DeepSpeedCPULion), and "
                "DeepSpeed refuses it: ZeRO steps it over flat shards, so an update that reads "
                "a parameter's shape or whole norm would differ. Add "
                "\"zero_allow_untested_optimizer\": true to the config to train it anyway")
        elementwise = tuple(getattr(torch.optim, n) for n in ELEMENTWISE_TORCH_OPTIMIZERS) + (
            Lion,)
        if self.stage == 0 and cls not in tested + elementwise:
            raise ZeroliteConfigError(
                f"optimizer: {_name(cls)} is not an element-wise optimizer zerolite knows, and "
                "zerolite steps the optimizer over flat buffers at stage 0 too (DeepSpeed steps "
                "the parameters there), so an update that reads a parameter's shape or whole "
                "norm would differ. Add \"zero_allow_untested_optimizer\": true to the config "
                "if its update is element-wise")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def build_optimizer(opt_type: str | None, opt_params: dict | None, client_optimizer,
                    master_groups: list[dict], cpu_optimizer: bool = False,
                    master_rounding: str | None = None, bf16_optimizer_states: bool = False,
                    rules: ZeroOptimizerRules = ZeroOptimizerRules()
                    ) -> torch.optim.Optimizer | None:
    """Optimizer over `master_groups` ([{"params": [fp32 shards], **group hparams}, ...], one
    per param group the user passed, in order).

    `client_optimizer` may be a torch.optim.Optimizer built over the model's parameters (it is
    trained itself, its groups re-pointed at the shards: see param_groups.py), a callable
    taking the param groups, or None (then `opt_type`/`opt_params` from the config are used;
    `cpu_optimizer` is DeepSpeed's `zero_use_cpu_optimizer`: offload_optimizer on cpu or nvme).
    `master_rounding` (bf16 masters only, else None) is given to the Adam classes that take
    it; with `bf16_optimizer_states` DeepSpeedCPUAdam keeps its moments in bf16 (DeepSpeed
    overrides `fp32_optimizer_states` the same way). `rules` are checked before the client's
    optimizer is touched or one is built (a callable's only once it returned it).
    """
    if isinstance(client_optimizer, torch.optim.Optimizer):
        rules.check(type(client_optimizer), cpu_optimizer, client=True)
        return adopt_client_optimizer(client_optimizer, [g["params"] for g in master_groups])
    # Groups with nothing to train on this rank are left out of an optimizer built here.
    master_groups = [g for g in master_groups if g["params"]]
    if client_optimizer is not None:
        if callable(client_optimizer):
            opt = client_optimizer(master_groups)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError("initialize(optimizer=callable): the callable must return a "
                                f"torch.optim.Optimizer, got {type(opt).__name__}")
            rules.check(type(opt), cpu_optimizer, client=True)
            return opt
        raise TypeError("initialize(optimizer=...) must be a torch.optim.Optimizer or a callable "
                        f"taking param groups, got {type(client_optimizer).__name__}")
    if opt_type is None:
        return None
    # DeepSpeed's defaults (e.g. weight_decay 0.0, not torch AdamW's 0.01) are filled in by
    # zerolite.config, which also validated every value.
    params = dict(opt_params or {})
    cls = _optimizer_class(opt_type, params, cpu_optimizer)
    rules.check(cls, cpu_optimizer, client=False)
    if params.get("fp32_optimizer_states", False) is None:
        del params["fp32_optimizer_states"]  # null: the class's default (DeepSpeed: true)
    kwargs = accepted_kwargs(cls, params)
    if _host_fused_adam(cls, params, master_groups):
        kwargs["fused"] = True
    accepted = inspect.signature(cls.__init__).parameters
    if master_rounding is not None and "master_rounding" in accepted:
        kwargs["master_rounding"] = master_rounding
    if bf16_optimizer_states and "fp32_optimizer_states" in accepted:
        if kwargs.get("fp32_optimizer_states"):
            logger.warning("zerolite: bf16.bf16_optimizer_states is true; overriding the "
                           "optimizer's fp32_optimizer_states to False (as DeepSpeed does)")
        kwargs["fp32_optimizer_states"] = False
    return cls(master_groups, **kwargs)


def _host_fused_adam(cls, params: dict, master_groups: list[dict]) -> bool:
    """Whether a config-built Adam/AdamW over host (CPU) masters should use torch's fused kernel.

    [Note: fused CPU Adam] On CPU torch's default (foreach=None) is the single-tensor for-loop;
    fused=True is 5-10x faster on our flat shards and about as fast as DeepSpeedCPUAdam
    (benchmarks/cpu_adam_bench.py). DeepSpeed itself steps host state with its own kernel unless
    `torch_adam` is true, so zerolite does the same: `"torch_adam": true` keeps torch's default.
    The fused update is not bitwise the for-loop's: it differs by at most 2.4e-7 in a parameter
    after 10 steps (|param| <= 5), so references built on plain torch AdamW compare with a
    tolerance (tests/test_host_adam.py measures the difference).
    Client optimizers are trained as the user made them (plain torch users get torch's default).
    """
    from zerolite.optim.deepspeed_optimizers import FusedAdam

    if cls is not FusedAdam:  # torch_adam keeps torch's default; DeepSpeedCPUAdam is fused
        return False
    masters = [p for g in master_groups for p in g["params"]]
    return bool(masters) and all(p.device.type == "cpu" for p in masters)


def check_master_optimizer(optimizer, *, offloaded: bool, bf16_states: bool,
                           master_rounding: str) -> None:
    """bf16.bf16_master_weights_and_grads: DeepSpeed's rule for the optimizer (its
    `_configure_master_weights`: with offload_optimizer, or without bf16_optimizer_states, the
    optimizer must be DeepSpeedCPUAdam, and with both offload and bf16 states its moments must
    be bf16), and a warning where zerolite.master_rounding cannot apply."""
    from zerolite.optim.deepspeed_optimizers import DeepSpeedCPUAdam
    from zerolite.optim.master_update import LowPrecisionAdamStep

    name = type(optimizer).__name__
    if offloaded or not bf16_states:
        if not isinstance(optimizer, DeepSpeedCPUAdam):
            raise ZeroliteConfigError(
                "bf16.bf16_master_weights_and_grads with zero_optimization.offload_optimizer "
                "(required without bf16.bf16_optimizer_states) needs the optimizer to be "
                f"DeepSpeedCPUAdam, as in DeepSpeed; got {name}: use a config optimizer block "
                "with type Adam/AdamW (without torch_adam) or pass DeepSpeedCPUAdam")
        if bf16_states and optimizer.defaults.get("fp32_optimizer_states", True):
            raise ZeroliteConfigError(
                "bf16.bf16_optimizer_states with offload_optimizer needs DeepSpeedCPUAdam "
                "built with fp32_optimizer_states=False (its moments in bf16), as in DeepSpeed")
    groups = optimizer.param_groups
    if not isinstance(optimizer, LowPrecisionAdamStep) or any(
            g.get("master_rounding", "nearest") != master_rounding for g in groups):
        logger.warning("zerolite: bf16 master weights are stepped by %s, which %s; "
                       "zerolite.master_rounding=%r applies to the Adam/AdamW an optimizer "
                       "config block builds", name,
                       "rounds them to nearest" if isinstance(optimizer, LowPrecisionAdamStep)
                       else "updates them with its own bf16 arithmetic", master_rounding)
