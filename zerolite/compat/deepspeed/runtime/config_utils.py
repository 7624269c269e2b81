"""`deepspeed.runtime.config_utils`: DeepSpeedConfigModel, the base of DeepSpeed's config
sections (a pydantic model there; a small class of our own here, without pydantic).

What programs rely on is kept: construction by keyword with every field's default, "auto"
values dropped unless `strict=True` (so they fall back to the default, as Hugging Face configs
expect), unknown keys refused with an error naming them (DeepSpeed: `extra="forbid"`),
attribute access, `model_fields_set`, `model_dump()` and equality by value.
"""
from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

from zerolite.errors import ZeroliteConfigError


class Factory:
    """A field default made fresh for each instance (pydantic's `default_factory`)."""

    def __init__(self, make):
        self.make = make


class DeepSpeedConfigModel:
    FIELDS: ClassVar[dict[str, Any]] = {}
    """Field name -> default (a Factory for mutable ones). A subclass sets it, or declares
    fields as DeepSpeed's do, by annotated class attributes (`my_field: int = 0`)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "FIELDS" not in cls.__dict__:
            fields = dict(cls.FIELDS)  # the base's, then this class's annotations
            for name in cls.__dict__.get("__annotations__", {}):
                if not name.startswith("_"):
                    fields[name] = cls.__dict__.get(name)
            cls.FIELDS = fields

    def __init__(self, strict: bool = False, **data):
        if not strict:
            data = {k: v for k, v in data.items() if not _is_auto(v) or k == "replace_method"}
        values = self._validate(dict(data))
        object.__setattr__(self, "_fields_set", frozenset(data))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def _validate(cls, data: dict) -> dict:
        """Field values from the given keys; subclasses check and convert them."""
        unknown = sorted(set(data) - set(cls.FIELDS))
        if unknown:
            raise ZeroliteConfigError(f"{cls.__name__}: unknown field(s) {unknown}; expected "
                                      f"some of {sorted(cls.FIELDS)}")
        out = {name: (d.make() if isinstance(d, Factory) else copy.deepcopy(d))
               for name, d in cls.FIELDS.items()}
        out.update(data)
        return out

    @property
    def model_fields_set(self) -> set:
        """The fields the caller gave (not defaulted)."""
        return set(self._fields_set)

    def model_dump(self) -> dict:
        return {name: _dump(getattr(self, name)) for name in self.FIELDS}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(), default=str)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.model_dump() == self.model_dump()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.model_dump().items())
        return f"{type(self).__name__}({args})"


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _dump(value):
    if isinstance(value, DeepSpeedConfigModel):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def get_scalar_param(param_dict: dict, param_name: str, param_default_value):
    """`param_dict[param_name]`, or the default (DeepSpeed's helper)."""
    return param_dict.get(param_name, param_default_value)


def dict_raise_error_on_duplicate_keys(ordered_pairs):
    """object_pairs_hook for json/hjson that refuses a key given twice (DeepSpeed's)."""
    out = {}
    for key, value in ordered_pairs:
        if key in out:
            raise ValueError(f"Duplicate key in DeepSpeed config: {key}")
        out[key] = value
    return out


__all__ = ["DeepSpeedConfigModel", "get_scalar_param", "dict_raise_error_on_duplicate_keys"]
