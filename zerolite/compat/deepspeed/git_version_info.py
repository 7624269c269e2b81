"""`deepspeed.git_version_info`: what the installed DeepSpeed was built with, answered for
zerolite: the DeepSpeed API version it follows, no compiled ops (zerolite builds none), and
the running torch (DeepSpeed records the torch it was built against; the op builders read it)."""
from __future__ import annotations

import torch

from zerolite.compat import DEEPSPEED_API_VERSION


def _major_minor(text) -> str:
    return ".".join(str(text).split("+")[0].split(".")[:2]) if text else "0.0"


def _nccl_version() -> str:
    if not torch.cuda.is_available():
        return "0.0"
    try:
        major, minor, *_ = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return "0.0"
    return f"{major}.{minor}"


version = DEEPSPEED_API_VERSION
git_hash = None
git_branch = None
installed_ops = dict.fromkeys(("async_io", "cpu_adagrad", "cpu_adam", "cpu_lion", "fused_adam",
                               "fused_lamb", "fused_lion", "transformer_inference"), False)
"""No DeepSpeed op is compiled: zerolite's optimizers and kernels are its own."""
accelerator_name = "cuda" if torch.cuda.is_available() else "cpu"
torch_info = {"version": _major_minor(torch.__version__),
              "bf16_support": bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
              "cuda_version": _major_minor(torch.version.cuda),
              "nccl_version": _nccl_version(),
              "hip_version": _major_minor(getattr(torch.version, "hip", None))}

__all__ = ["version", "git_hash", "git_branch", "installed_ops", "accelerator_name", "torch_info"]
