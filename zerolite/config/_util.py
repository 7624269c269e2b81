"""Shared helpers for parsing DeepSpeed-style JSON: typed checks whose errors name the JSON path.

Every failure raises :class:`ZeroliteConfigError` with a one-line message of the form
``<json.path>: got <value> (<type>); expected <what>``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, ClassVar, NoReturn

import torch

from zerolite.errors import ZeroliteConfigError

logger = logging.getLogger("zerolite")

AUTO = "auto"
"""The placeholder Hugging Face Trainer writes for values it fills in itself."""

REQUIRED = object()
"""Sentinel default for keys that have no default (e.g. WarmupDecayLR total_num_steps)."""


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def show(value: Any) -> str:
    """A short single-line rendering of a user value, with its JSON-ish type."""
    text = repr(value).replace("\n", " ").replace("\r", " ")
    if len(text) > 80:
        text = text[:77] + "..."
    kind = {bool: "bool", int: "int", float: "float", str: "string", list: "list",
            tuple: "list", dict: "object", type(None): "null"}.get(type(value), type(value).__name__)
    return f"{text} ({kind})"


DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16",
               "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfp16": "bf16",
               "bfloat16": "bf16"}
"""DeepSpeed's spellings of the floating dtypes a config may name -> zerolite's short name."""
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""zerolite's short dtype name (what the config holds) -> the torch dtype."""


def check_dtype_name(path: str, v: Any, *, none_ok: bool = True) -> str | None:
    """One of DTYPE_NAMES (any case) -> "fp32" / "fp16" / "bf16"; None passes if `none_ok`."""
    if v is None and none_ok:
        return None
    if not isinstance(v, str) or v.strip().lower() not in DTYPE_NAMES:
        fail(path, v, "one of 'fp32', 'fp16', 'bf16'" + (" (or null)" if none_ok else ""))
    return DTYPE_NAMES[v.strip().lower()]


def fail(path: str, value: Any, expected: str) -> NoReturn:
    raise ZeroliteConfigError(f"{path}: got {show(value)}; expected {expected}")


def fail_msg(path: str, message: str) -> NoReturn:
    raise ZeroliteConfigError(f"{path}: {message}".replace("\n", " "))


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _bounds(ge=None, gt=None, le=None) -> str:
    parts = []
    if gt is not None:
        parts.append(f"> {gt}")
    if ge is not None:
        parts.append(f">= {ge}")
    if le is not None:
        parts.append(f"<= {le}")
    return (" " + " and ".join(parts)) if parts else ""


def check_bool(path: str, v: Any, *, none_ok: bool = False) -> bool | None:
    if v is None and none_ok:
        return None
    if not isinstance(v, bool):
        fail(path, v, "true or false" + (" or null" if none_ok else ""))
    return v


def check_int(path: str, v: Any, *, ge=None, gt=None, le=None, none_ok: bool = False) -> int | None:
    """An integer; integral floats such as 1e9 (common in DeepSpeed configs) are accepted."""
    if v is None and none_ok:
        return None
    want = "an integer" + _bounds(ge, gt, le) + (" or null" if none_ok else "")
    if isinstance(v, bool):
        fail(path, v, want)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if not isinstance(v, int):
        fail(path, v, want)
    if (ge is not None and v < ge) or (gt is not None and v <= gt) or (le is not None and v > le):
        fail(path, v, want)
    return v


def check_float(path: str, v: Any, *, ge=None, gt=None, le=None, lt=None,
                none_ok: bool = False) -> float | None:
    if v is None and none_ok:
        return None
    want = "a finite number" + _bounds(ge, gt, le) + (f" and < {lt}" if lt is not None else "") \
        + (" or null" if none_ok else "")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        fail(path, v, want)
    if ((ge is not None and v < ge) or (gt is not None and v <= gt)
            or (le is not None and v > le) or (lt is not None and v >= lt)):
        fail(path, v, want)
    return float(v)


def check_str(path: str, v: Any, *, choices=None, none_ok: bool = False) -> str | None:
    if v is None and none_ok:
        return None
    if choices is not None:
        want = "one of " + ", ".join(repr(c) for c in choices) + (" or null" if none_ok else "")
        if not isinstance(v, str) or v not in choices:
            fail(path, v, want)
    elif not isinstance(v, str):
        fail(path, v, "a string" + (" or null" if none_ok else ""))
    return v


def check_object(path: str, v: Any) -> dict:
    if not isinstance(v, dict):
        fail(path, v, "a JSON object")
    return v


@dataclasses.dataclass
class ParseContext:
    """State shared while one config is parsed."""

    hidden_size: int | None = None
    """Model hidden size, used to resolve "auto" bucket sizes."""
    unknown: list = dataclasses.field(default_factory=list)
    """Dotted paths of keys nobody recognised (reported in one warning)."""
    optimizer_lr: float | None = None
    """The resolved optimizer lr, so a scheduler's warmup_max_lr "auto" can follow it."""

    def resolved(self, path: str, value: Any, why: str) -> None:
        logger.info("zerolite config: %s: 'auto' -> %r (%s)", path, value, why)


class Section:
    """Mixin for config dataclasses built from one JSON object.

    Subclasses set ``_PATH`` (the JSON path), optionally ``_ALIASES`` (JSON key -> field name),
    ``_EXTRA_KNOWN`` (DeepSpeed keys accepted but not modelled) and ``_AUTO_DEFAULT`` (fields
    whose "auto" means "the DeepSpeed default"); they may override ``_auto_rules``.
    """

    _PATH: ClassVar[str] = ""
    _ALIASES: ClassVar[dict] = {}
    _EXTRA_KNOWN: ClassVar[frozenset] = frozenset()
    _AUTO_DEFAULT: ClassVar[frozenset] = frozenset()

    @classmethod
    def _auto_rules(cls, ctx: ParseContext) -> dict:
        """Field name -> (value, reason) for "auto" values this section can resolve."""
        return {}

    @classmethod
    def _preprocess(cls, d: dict, ctx: ParseContext) -> dict:
        return d

    @classmethod
    def from_dict(cls, d: Any, ctx: ParseContext):
        if d is None:
            d = {}
        check_object(cls._PATH, d)
        d = cls._preprocess(dict(d), ctx)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        kwargs: dict = {}
        seen_as: dict = {}
        rules = None
        for key, value in d.items():
            name = cls._ALIASES.get(key, key)
            if name not in fields:
                if key not in cls._EXTRA_KNOWN:
                    ctx.unknown.append(join(cls._PATH, key))
                continue
            path = join(cls._PATH, key)
            if name in seen_as:
                fail_msg(path, f"given twice (as {seen_as[name]!r} and {key!r}); keep one")
            seen_as[name] = key
            if is_auto(value):
                rules = cls._auto_rules(ctx) if rules is None else rules
                if name in rules:
                    value, why = rules[name]
                elif name in cls._AUTO_DEFAULT:
                    value = _field_default(fields[name])
                    why = "DeepSpeed default"
                else:
                    fail(path, value, "a concrete value ('auto' cannot be resolved for this key)")
                ctx.resolved(path, value, why)
            kwargs[name] = value
        return cls(**kwargs)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
