"""Exceptions users see. Each says what was wrong, where, and what to do."""


class ZeroliteError(RuntimeError):
    """Base class for zerolite's own errors."""


class ZeroliteConfigError(ZeroliteError, ValueError):
    """A DeepSpeed-style config (file, dict or argument) is invalid.

    The message names the JSON path of the bad key, the value found and what is expected.
    """


class ZeroliteStateError(ZeroliteError):
    """The engine was used out of order (e.g. step() before backward())."""


class DeepSpeedFeatureNotSupported(ZeroliteError, NotImplementedError):
    """A DeepSpeed feature that zerolite (ZeRO data parallelism only) does not implement."""


def not_supported_message(name: str, why: str) -> str:
    return (f"{name}: not supported by zerolite's DeepSpeed alias ({why}). zerolite provides "
            "ZeRO stages 0-3 data parallelism; run this program with the real DeepSpeed to use it.")
