"""DeepSpeed features zerolite does not have: one clear error each, raised where the program
uses the feature (importing the name is fine, as DeepSpeed's CIFAR example imports MoE helpers
with MoE off)."""
from __future__ import annotations

from zerolite.errors import DeepSpeedFeatureNotSupported  # noqa: F401  (re-exported)
from zerolite.errors import not_supported_message as message


def refused_function(name: str, why: str):
    def refused(*_args, **_kwargs):
        raise DeepSpeedFeatureNotSupported(message(name, why))

    refused.__name__ = name.rsplit(".", 1)[-1]
    refused.__qualname__ = refused.__name__
    refused.__doc__ = f"Refused: {why}."
    return refused


def refused_class(name: str, why: str, base: type = object):
    """A class that can be named, subclassed and isinstance-checked, but not instantiated."""

    def __init__(self, *_args, **_kwargs):
        raise DeepSpeedFeatureNotSupported(message(name, why))

    short = name.rsplit(".", 1)[-1]
    return type(short, (base,), {"__init__": __init__, "__doc__": f"Refused: {why}.",
                                 "__module__": name.rsplit(".", 1)[0]})
