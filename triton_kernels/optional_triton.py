"""Triton as an optional import, shared by the kernel modules: the package must import without
triton. Import this only after `runtime.use_interpreter_if_no_cuda()` (TRITON_INTERPRET is read
when triton is imported)."""
from __future__ import annotations

import importlib.util

TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
IMPORT_ERROR: str | None = None
"""Why an installed triton failed to import (None when it imported or is not installed)."""
try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception as exc:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False
    if TRITON_INSTALLED:
        IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = ["HAS_TRITON", "IMPORT_ERROR", "TRITON_INSTALLED", "tl", "triton"]
