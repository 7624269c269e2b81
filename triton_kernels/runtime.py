"""How the Triton kernels run on this machine: compiled on CUDA, interpreted only where
there is no CUDA device.

Triton reads TRITON_INTERPRET when a kernel is *defined* (`@triton.jit` at import of
`quantize_triton`), so the choice is made once per process, before triton is imported.
[Note: never interpret on a GPU] A test session that set TRITON_INTERPRET=1 on a CUDA
machine would compare the interpreter with the twins and compile nothing; we refuse it.
"""
from __future__ import annotations

import os
import sys

import torch

_TRUE = ("1", "true", "yes", "on")


def interpreting() -> bool:
    """Will (or did) triton define kernels for its CPU interpreter in this process?"""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def use_interpreter_if_no_cuda() -> bool:
    """Call before importing triton (tests, benchmarks). Returns True when interpreting."""
    if torch.cuda.is_available():
        if interpreting():
            raise RuntimeError("TRITON_INTERPRET=1 is set on a machine with CUDA: the Triton "
                               "kernels would run in the interpreter and the GPU would test "
                               "nothing; unset TRITON_INTERPRET")
        return False
    for mod in ("triton_kernels.quantize_triton", "triton_kernels.topk_triton",
                "triton_kernels.adamw_triton"):
        if mod in sys.modules and not interpreting():
            raise RuntimeError(f"{mod} was imported before use_interpreter_if_no_cuda(): its "
                               "kernels are already defined for a GPU this machine does not "
                               "have")
    os.environ["TRITON_INTERPRET"] = "1"
    return True
