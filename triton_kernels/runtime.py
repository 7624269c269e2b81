"""How the Triton kernels run on this machine: compiled on CUDA, interpreted only where
there is no CUDA device.

Triton reads TRITON_INTERPRET when a kernel is *defined* (`@triton.jit` at import of
`quantize_triton`), so the choice is made once per process, before triton is imported.
[Note: never interpret on a GPU] A test session that set TRITON_INTERPRET=1 on a CUDA
machine would compare the interpreter with the twins and compile nothing; we refuse it.

[Note: the interpreter's fma] A GPU's `tl.fma` rounds once. Triton's interpreter up to 3.6
computes it as a multiply and then an add, rounding twice (3.9's rounds once), so a kernel
interpreted there differs from the same kernel compiled wherever the fma's exact result is
not an fp32 value. Where the installed interpreter rounds twice, `use_interpreter_if_no_cuda`
gives it a single-rounding fp32 fma (the twins' `fma32`), so the interpreter computes what
the compiled kernel does, on every triton the project supports.
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
    _round_interpreter_fma_once()
    return True


def _round_interpreter_fma_once() -> None:
    """The Note above: replace a twice-rounding interpreter fma for fp32 operands."""
    import numpy as np
    from triton.runtime import interpreter

    from triton_kernels.adamw_ref import fma32

    builder, handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
    original = builder.create_fma
    if getattr(original, "_rounds_once", False):
        return
    import triton.language as tl

    one_ulp = np.float32(1 + 2 ** -12)  # (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24 exactly
    probe = original(None, *(handle(np.array([x], np.float32), tl.float32)
                             for x in (one_ulp, one_ulp, -(1 + 2 ** -11))))
    if probe.data[0] == np.float32(2 ** -24):
        return

    def create_fma(self, x, y, z):
        if z.data.dtype != np.float32:
            return original(self, x, y, z)
        a, b, c = (torch.from_numpy(np.ascontiguousarray(t, np.float32).reshape(-1))
                   for t in np.broadcast_arrays(x.data, y.data, z.data))
        out = fma32(a, b, c).numpy().reshape(np.broadcast_shapes(
            np.shape(x.data), np.shape(y.data), np.shape(z.data)))
        return handle(out, z.dtype.scalar)

    create_fma._rounds_once = True
    builder.create_fma = create_fma
