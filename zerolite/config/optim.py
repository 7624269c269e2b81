"""``optimizer`` and ``scheduler`` sections: canonical type names and DeepSpeed's default params."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

from ._util import (
    REQUIRED, ParseContext, check_bool, check_float, check_int, check_object, check_str, fail,
    fail_msg, is_auto, join, logger,
)


@dataclass(frozen=True)
class Num:
    """A finite float within optional bounds."""

    ge: float | None = None
    le: float | None = None

    def check(self, path: str, v: Any) -> float:
        return check_float(path, v, ge=self.ge, le=self.le)

    @property
    def describe(self) -> str:
        if self.ge is not None and self.le is not None:
            return f"float in [{self.ge:g}, {self.le:g}]"
        return "float" if self.ge is None else f"float >= {self.ge:g}"


@dataclass(frozen=True)
class Int:
    """An integer (integral floats accepted) within optional bounds; `optional`: null too."""

    ge: int | None = None
    gt: int | None = None
    optional: bool = False

    def check(self, path: str, v: Any) -> int | None:
        return check_int(path, v, ge=self.ge, gt=self.gt, none_ok=self.optional)

    @property
    def describe(self) -> str:
        bound = f" >= {self.ge}" if self.ge is not None else f" > {self.gt}" \
            if self.gt is not None else ""
        return f"int{bound}" + (" or null" if self.optional else "")


@dataclass(frozen=True)
class Bool:
    optional: bool = False

    def check(self, path: str, v: Any) -> bool | None:
        return check_bool(path, v, none_ok=self.optional)

    @property
    def describe(self) -> str:
        return "bool" + (" or null" if self.optional else "")


@dataclass(frozen=True)
class Choice:
    choices: tuple[str, ...]

    def check(self, path: str, v: Any) -> str:
        return check_str(path, v, choices=self.choices)

    @property
    def describe(self) -> str:
        return " or ".join(f'"{c}"' for c in self.choices)


@dataclass(frozen=True)
class Betas:
    """A pair of floats in [0, 1)."""

    def check(self, path: str, v: Any) -> tuple[float, float]:
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            fail(path, v, "a list of two numbers in [0, 1)")
        return tuple(check_float(f"{path}[{i}]", b, ge=0, lt=1) for i, b in enumerate(v))

    describe = "[float, float] in [0, 1)"


@dataclass(frozen=True)
class PerGroup:
    """One value, or a list of them, one per optimizer param group (the count is checked by
    the schedule, which knows the optimizer); `optional`: null = each group's own lr."""

    one: Num
    optional: bool = False

    def check(self, path: str, v: Any):
        if v is None and self.optional:
            return None
        if isinstance(v, (list, tuple)):
            if not v:
                fail(path, v, "a number or a non-empty list of numbers (one per param group)")
            return [self.one.check(f"{path}[{i}]", x) for i, x in enumerate(v)]
        return self.one.check(path, v)

    @property
    def describe(self) -> str:
        return f"{self.one.describe}, or a list (one per param group)" + (
            "; null: each group's own lr" if self.optional else "")


Rule = Num | Int | Bool | Choice | Betas | PerGroup
"""How one optimizer / scheduler parameter is checked: `rule.check(json_path, value)`."""

LR = NONNEG = Num(ge=0)
FLOAT = Num()
RATIO = Num(ge=0, le=1)
BOOL = Bool()
BETAS = Betas()
WARMUP_TYPE = Choice(("log", "linear"))
STEP = Int(ge=-1)
"""last_batch_iteration: -1 (not started) or a batch index."""
POSITIVE = Int(gt=0)
LR_GROUPS = PerGroup(LR)
RATIO_GROUPS = PerGroup(RATIO)

_BETAS = (0.9, 0.999)
TORCH_ADAMW_WEIGHT_DECAY = 0.01
"""torch.optim.AdamW's default weight decay: what an Adam/AdamW config with `torch_adam` true
and no weight_decay trains with under DeepSpeed (without torch_adam: FusedAdam's 0.0)."""
_ADAM = {"lr": (1e-3, LR), "betas": (_BETAS, BETAS), "eps": (1e-8, NONNEG),
         "weight_decay": (0.0, NONNEG), "bias_correction": (True, BOOL),
         "amsgrad": (False, BOOL), "adam_w_mode": (True, BOOL), "torch_adam": (False, BOOL),
         # DeepSpeedCPUAdam's (offload_optimizer): null = fp32 moments unless
         # bf16.bf16_optimizer_states
         "fp32_optimizer_states": (None, Bool(optional=True))}

OPTIMIZER_PARAMS: dict[str, dict[str, tuple[Any, Rule]]] = {
    "Adam": _ADAM,
    "AdamW": _ADAM,
    "SGD": {"lr": (1e-3, LR), "momentum": (0.0, NONNEG), "dampening": (0.0, FLOAT),
            "weight_decay": (0.0, NONNEG), "nesterov": (False, BOOL)},
    "Adagrad": {"lr": (1e-2, LR), "eps": (1e-10, NONNEG), "weight_decay": (0.0, NONNEG),
                "lr_decay": (0.0, NONNEG), "initial_accumulator_value": (0.0, NONNEG)},
    "Lamb": {"lr": (1e-3, LR), "betas": (_BETAS, BETAS), "eps": (1e-8, NONNEG),
             "weight_decay": (0.0, NONNEG), "bias_correction": (True, BOOL),
             "eps_inside_sqrt": (False, BOOL), "max_grad_norm": (0.0, NONNEG),
             "max_coeff": (10.0, NONNEG), "min_coeff": (0.01, NONNEG), "amsgrad": (False, BOOL)},
    "Lion": {"lr": (1e-3, LR), "betas": (_BETAS, BETAS), "weight_decay": (0.0, NONNEG)},
    # DeepSpeed looks any other name up in torch.optim and passes the params through, so the
    # defaults are torch's. Only the element-wise ones are here (zerolite steps flat shards).
    "RMSprop": {"lr": (1e-2, LR), "alpha": (0.99, NONNEG), "eps": (1e-8, NONNEG),
                "weight_decay": (0.0, NONNEG), "momentum": (0.0, NONNEG),
                "centered": (False, BOOL)},
    "Adamax": {"lr": (2e-3, LR), "betas": (_BETAS, BETAS), "eps": (1e-8, NONNEG),
               "weight_decay": (0.0, NONNEG)},
    "NAdam": {"lr": (2e-3, LR), "betas": (_BETAS, BETAS), "eps": (1e-8, NONNEG),
              "weight_decay": (0.0, NONNEG), "momentum_decay": (4e-3, NONNEG),
              "decoupled_weight_decay": (False, BOOL)},
    "RAdam": {"lr": (1e-3, LR), "betas": (_BETAS, BETAS), "eps": (1e-8, NONNEG),
              "weight_decay": (0.0, NONNEG), "decoupled_weight_decay": (False, BOOL)},
    "Adadelta": {"lr": (1.0, LR), "rho": (0.9, RATIO), "eps": (1e-6, NONNEG),
                 "weight_decay": (0.0, NONNEG)},
}
"""Supported optimizer type -> {param: (DeepSpeed default, Rule)}."""

_WARMUP = {"warmup_min_lr": (0.0, LR_GROUPS), "warmup_max_lr": (1e-3, LR_GROUPS),
           "warmup_num_steps": (1000, POSITIVE), "warmup_type": ("log", WARMUP_TYPE),
           "last_batch_iteration": (-1, STEP)}

SCHEDULER_PARAMS: dict[str, dict[str, tuple[Any, Rule]]] = {
    # Note: WarmupLR without warmup_max_lr warms each group up to its own lr (DeepSpeed's code;
    # its docs say 0.001, which WarmupDecayLR keeps).
    "WarmupLR": {**_WARMUP, "warmup_max_lr": (None, PerGroup(LR, optional=True))},
    "WarmupDecayLR": {**_WARMUP, "total_num_steps": (REQUIRED, POSITIVE)},
    "WarmupCosineLR": {"total_num_steps": (REQUIRED, POSITIVE), "warmup_min_ratio": (0.0, RATIO),
                       "warmup_num_steps": (1000, POSITIVE), "cos_min_ratio": (0.0001, RATIO),
                       "warmup_type": ("log", WARMUP_TYPE), "last_batch_iteration": (-1, STEP)},
    # Note: stair counts <= 0 mean "no stairs" (DeepSpeed's argparse default is -1).
    "OneCycle": {"cycle_min_lr": (REQUIRED, LR_GROUPS), "cycle_max_lr": (REQUIRED, LR_GROUPS),
                 "decay_lr_rate": (0.0, NONNEG), "cycle_first_step_size": (2000, POSITIVE),
                 "cycle_second_step_size": (None, Int(gt=0, optional=True)),
                 "cycle_first_stair_count": (0, Int()),
                 "cycle_second_stair_count": (None, Int(optional=True)),
                 "decay_step_size": (0, Int(ge=0)),
                 "cycle_momentum": (True, BOOL), "cycle_min_mom": (0.8, RATIO_GROUPS),
                 "cycle_max_mom": (0.9, RATIO_GROUPS), "decay_mom_rate": (0.0, NONNEG),
                 "last_batch_iteration": (-1, STEP)},
    "LRRangeTest": {"lr_range_test_min_lr": (1e-3, LR_GROUPS),
                    "lr_range_test_step_size": (2000, POSITIVE),
                    "lr_range_test_step_rate": (1.0, NONNEG),
                    "lr_range_test_staircase": (False, BOOL),
                    "last_batch_iteration": (-1, STEP)},
}
"""Supported scheduler type -> {param: (DeepSpeed default or REQUIRED, Rule)}: the one set of
rules for schedule parameters, whether they come from JSON (SchedulerConfig) or from Python
(the schedule classes in zerolite.optim check their arguments here)."""

# Note: HF Trainer fills these with "auto"; other params have no sensible automatic value.
_OPT_AUTO_OK = ("lr", "betas", "eps", "weight_decay")


def _canonical(path: str, name: Any, table: dict, what: str) -> str:
    supported = ", ".join(table)
    if not isinstance(name, str):
        fail(path, name, f"a {what} name, one of {supported}")
    for canon in table:
        if canon.lower() == name.strip().lower():
            return canon
    fail(path, name, f"one of the {what} types zerolite supports: {supported}")


def _unknown_param(path: str, type_name: str, spec: dict) -> NoReturn:
    fail_msg(path, f"unknown parameter for {type_name}; accepted: {', '.join(spec)}")


def _parse_params(path: str, given: Any, spec: dict, ctx: ParseContext, auto_rule,
                  unknown_fails_for: str | None = None) -> dict:
    if given is None:
        given = {}
    check_object(path, given)
    out: dict = {}
    for key, value in given.items():
        kp = join(path, key)
        if is_auto(value):
            value = auto_rule(kp, key)
            if value is _DROP:
                continue
        if key not in spec and unknown_fails_for is not None:
            _unknown_param(kp, unknown_fails_for, spec)
        if key not in spec:
            ctx.unknown.append(kp)
            out[key] = value  # Note: kept as given; DeepSpeed passes unknown params through.
            continue
        out[key] = value  # checked once, by the section's __post_init__
    for key, (default, _rule) in spec.items():
        if key not in out:
            if default is REQUIRED:
                fail_msg(join(path, key), "missing; this scheduler requires it")
            out[key] = default
    return out


_DROP = object()


@dataclass
class OptimizerConfig:
    """``optimizer``: which optimizer the engine builds and with which hyper-parameters."""

    _PATH: ClassVar[str] = "optimizer"

    type: str
    """Canonical name, one of OPTIMIZER_PARAMS (case-insensitive in JSON)."""
    params: dict = field(default_factory=dict)
    """Hyper-parameters with DeepSpeed's defaults filled in (betas as a tuple)."""

    def __post_init__(self):
        self.type = _canonical("optimizer.type", self.type, OPTIMIZER_PARAMS, "optimizer")
        if not isinstance(self.params, dict):
            fail("optimizer.params", self.params, "a JSON object")
        spec = OPTIMIZER_PARAMS[self.type]
        for key, value in list(self.params.items()):
            if key in spec:
                self.params[key] = spec[key][1].check(f"optimizer.params.{key}", value)
        p = self.params
        if self.type == "SGD" and p.get("nesterov") and (p.get("momentum", 0) <= 0 or p.get("dampening", 0) != 0):
            fail_msg("optimizer.params.nesterov", "true requires momentum > 0 and dampening 0")
        if self.type in ("Adam", "AdamW") and p.get("bias_correction") is False:
            fail_msg("optimizer.params.bias_correction", "false is not supported: zerolite's "
                     "Adam/AdamW always correct the moment bias (as torch.optim does); remove "
                     "the key or set it true")
        if self.type == "AdamW" and p.get("adam_w_mode") is False:
            # Note: DeepSpeed always uses decoupled weight decay for AdamW, whatever adam_w_mode says.
            logger.warning("zerolite config: optimizer.params.adam_w_mode=false is ignored for AdamW")
            p["adam_w_mode"] = True

    @classmethod
    def from_dict(cls, d: Any, ctx: ParseContext) -> "OptimizerConfig | None":
        if d is None:
            return None
        check_object("optimizer", d)
        for key in d:
            if key not in ("type", "params", "legacy_fusion"):
                ctx.unknown.append(f"optimizer.{key}")
        if "type" not in d:
            fail_msg("optimizer.type", "missing; expected one of " + ", ".join(OPTIMIZER_PARAMS))
        canon = _canonical("optimizer.type", d["type"], OPTIMIZER_PARAMS, "optimizer")
        spec = OPTIMIZER_PARAMS[canon]

        def auto_rule(path, key):
            if key not in _OPT_AUTO_OK:
                fail(path, "auto", "a concrete value ('auto' is only resolved for "
                     + ", ".join(_OPT_AUTO_OK) + ")")
            if key not in spec:
                ctx.resolved(path, "(dropped)", f"{canon} has no {key}")
                return _DROP
            ctx.resolved(path, spec[key][0], f"DeepSpeed default for {canon}")
            return spec[key][0]

        params = _parse_params("optimizer.params", d.get("params"), spec, ctx, auto_rule)
        given = d.get("params") or {}
        if canon in ("Adam", "AdamW") and params.get("torch_adam") \
                and (canon == "AdamW" or params.get("adam_w_mode", True)) \
                and "weight_decay" not in given:
            # DeepSpeed hands the params as given to torch.optim.AdamW, so its default applies.
            params["weight_decay"] = TORCH_ADAMW_WEIGHT_DECAY
        out = cls(type=canon, params=params)
        ctx.optimizer_lr = out.params.get("lr")
        return out


@dataclass
class SchedulerConfig:
    """``scheduler``: DeepSpeed learning-rate schedule and its parameters."""

    _PATH: ClassVar[str] = "scheduler"

    type: str
    """Canonical name: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest."""
    params: dict = field(default_factory=dict)
    """Schedule parameters with DeepSpeed's defaults filled in."""

    def __post_init__(self):
        self.type = _canonical("scheduler.type", self.type, SCHEDULER_PARAMS, "scheduler")
        if not isinstance(self.params, dict):
            fail("scheduler.params", self.params, "a JSON object")
        spec = SCHEDULER_PARAMS[self.type]
        for key, value in list(self.params.items()):
            if key in spec:
                self.params[key] = spec[key][1].check(f"scheduler.params.{key}", value)
        for key, (default, _rule) in spec.items():
            if default is REQUIRED and self.params.get(key) is None:
                fail_msg(f"scheduler.params.{key}", f"missing; {self.type} requires it")
        p = self.params
        if self.type == "WarmupDecayLR" and p["total_num_steps"] < p["warmup_num_steps"]:
            logger.warning("zerolite config: scheduler.params.total_num_steps (%d) < warmup_num_steps "
                           "(%d): the learning rate never decays", p["total_num_steps"],
                           p["warmup_num_steps"])

    @classmethod
    def from_dict(cls, d: Any, ctx: ParseContext) -> "SchedulerConfig | None":
        if d is None:
            return None
        check_object("scheduler", d)
        for key in d:
            if key not in ("type", "params"):
                ctx.unknown.append(f"scheduler.{key}")
        if "type" not in d:
            fail_msg("scheduler.type", "missing; expected one of " + ", ".join(SCHEDULER_PARAMS))
        canon = _canonical("scheduler.type", d["type"], SCHEDULER_PARAMS, "scheduler")
        spec = SCHEDULER_PARAMS[canon]

        def auto_rule(path, key):
            if key == "warmup_max_lr" and ctx.optimizer_lr is not None:
                ctx.resolved(path, ctx.optimizer_lr, "optimizer.params.lr")
                return ctx.optimizer_lr
            if key not in spec or spec[key][0] is REQUIRED:
                fail(path, "auto", "a concrete value (zerolite cannot infer it; set it explicitly)")
            ctx.resolved(path, spec[key][0], f"DeepSpeed default for {canon}")
            return spec[key][0]

        # Note: one verdict for an unknown schedule parameter: an error here (it used to be kept
        # with a warning and then rejected when the schedule was built).
        params = _parse_params("scheduler.params", d.get("params"), spec, ctx, auto_rule,
                               unknown_fails_for=canon)
        return cls(type=canon, params=params)


def check_scheduler_keys(type_name: str, keys) -> None:
    """Every key is a parameter of schedule `type_name` and every required one is there."""
    spec = SCHEDULER_PARAMS[type_name]
    for key in keys:
        if key not in spec:
            _unknown_param(f"scheduler.params.{key}", type_name, spec)
    for key, (default, _rule) in spec.items():
        if default is REQUIRED and key not in keys:
            fail_msg(f"scheduler.params.{key}", f"missing; {type_name} requires it")


def check_scheduler_params(type_name: str, given: dict) -> dict:
    """Schedule parameters given from Python, checked by the same rules as the JSON section
    (no defaults filled in, no 'auto'); returns the normalised values."""
    check_scheduler_keys(type_name, given)
    spec = SCHEDULER_PARAMS[type_name]
    return {k: spec[k][1].check(f"scheduler.params.{k}", v) for k, v in given.items()}


def check_last_batch_iteration(value: Any) -> int:
    """A schedule position: -1 (not started) or a batch index."""
    return STEP.check("scheduler.params.last_batch_iteration", value)
