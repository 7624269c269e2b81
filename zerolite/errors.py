"""Exceptions users see. Each says what was wrong, where, and what to do."""


class ZeroliteError(RuntimeError):
    """Base class for zerolite's own errors."""


class ZeroliteConfigError(ZeroliteError, ValueError):
    """A DeepSpeed-style config (file, dict or argument) is invalid.

    The message names the JSON path of the bad key, the value found and what is expected.
    """


class ZeroliteStateError(ZeroliteError):
    """The engine was used out of order (e.g. step() before backward())."""
