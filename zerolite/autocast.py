"""DeepSpeed's torch_autocast mode: the autocast context the engine's forward runs in, and
the dtype each parameter's gradient is reduced in.

[Note: torch_autocast] As DeepSpeed 0.19 does it (runtime/torch_autocast.py and its ZeRO
optimizers):
  * parameters, masters and optimizer states stay fp32; the engine's forward (not the loss a
    program computes after it, nor the backward) runs under
    `torch.autocast(device, dtype)`, dtype null meaning torch's default for the device;
  * the parameters of the lower-precision-safe modules (torch.nn's Linear and Conv1d/2d/3d,
    or the classes `lower_precision_safe_modules` names; the class itself, not subclasses)
    carry `p.comm_dtype` = the autocast dtype, and at stages 1-3 their gradients are reduced
    in it; every other gradient is reduced in fp32 (communication_data_type does not apply).
    Stage 0 reduces everything in communication_data_type, as without autocast;
  * fp16 adds a GradScaler (torch.amp's arithmetic: 2**16 to start, halved on an overflow,
    doubled after 2000 clean steps; optim/loss_scaler.py). At stage 0 the gradients are
    unscaled before clipping and a non-finite step is dropped by the scaler yet counts as
    applied (the lr schedule moves). At stages 1-3 the ZeRO step sees the scaled gradients:
    the reported norm and the clipping are of scaled gradients, a non-finite step is skipped
    without updating the scale, and the scaler unscales just before the optimizer steps;
  * a program's own autocast around the engine's call: when the CUDA autocast flag is set
    (`torch.is_autocast_enabled()` without a device, which is what DeepSpeed asks) the
    engine's forward runs under its own setting, autocast off when torch_autocast is off.
    A CPU-only autocast around the call is left alone, as DeepSpeed leaves it.
  * at stage 3 over more than one rank, a fetch (a unit gathered for a forward, a backward,
    a recompute or a direct call, prefetches included) gathers the safe parameters' flats in
    the autocast dtype, as DeepSpeed's fetch does: only a weight also read outside
    autocast's casts (an embedding tied to a Linear head) sees the rounding. The persistent
    parameters, GatheredParameters and checkpoints gather exactly, as DeepSpeed's
    synchronous gathers do.
"""
from __future__ import annotations

import importlib
from contextlib import nullcontext

import torch
import torch.nn as nn

from zerolite.config import TORCH_DTYPES
from zerolite.errors import ZeroliteConfigError

LOWER_PRECISION_SAFE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def default_safe_module_names() -> list[str]:
    """The default classes as "package.Class" strings (DeepSpeed's spelling)."""
    return [f"{c.__module__}.{c.__name__}" for c in LOWER_PRECISION_SAFE_MODULES]


def safe_module_classes(names: list[str] | None) -> tuple[type, ...]:
    """`lower_precision_safe_modules` resolved to classes; None = the defaults."""
    if names is None:
        return LOWER_PRECISION_SAFE_MODULES
    classes = []
    for i, name in enumerate(names):
        package, _, cls_name = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(package), cls_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ZeroliteConfigError(
                f"torch_autocast.lower_precision_safe_modules[{i}]: cannot import {name!r} "
                f"({type(exc).__name__}: {exc}); expected \"package.Class\"") from None
        classes.append(cls)
    return tuple(classes)


class TorchAutocast:
    """One engine's torch_autocast settings; built once from the config section."""

    def __init__(self, section, device: torch.device):
        self.enabled = section.enabled
        self.dtype = TORCH_DTYPES[section.dtype] if section.enabled and section.dtype else None
        """The autocast dtype the config names (None: torch's default for the device)."""
        self.module_names = section.lower_precision_safe_modules
        self.classes = safe_module_classes(self.module_names) if self.enabled else ()
        self.device_type = device.type

    @property
    def needs_grad_scaler(self) -> bool:
        return self.dtype == torch.float16

    def comm_dtypes(self, model: nn.Module, stage: int) -> dict[nn.Parameter, torch.dtype]:
        """Mark each safe module's parameters with `comm_dtype` (DeepSpeed's attribute) and
        return the dtype every parameter's gradient is reduced in at stages 1-3 (empty at
        stage 0 or when off: the reducer's own dtype applies)."""
        if not self.enabled:
            return {}
        safe = {p for m in model.modules() if type(m) in self.classes
                for p in m.parameters(recurse=False)}
        for p in safe:
            p.comm_dtype = self.dtype
        if stage == 0:
            return {}
        return {p: (self.dtype or p.dtype) if p in safe else p.dtype
                for p in model.parameters()}

    def forward_context(self):
        """The context the engine's forward runs in ([Note: torch_autocast])."""
        if _cuda_autocast_flag():
            return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)
        if self.enabled:
            return torch.autocast(self.device_type, dtype=self.dtype)
        return nullcontext()


def _cuda_autocast_flag() -> bool:
    """`torch.is_autocast_enabled()` without a device: the CUDA flag (torch >= 2.4 takes the
    device; 2.3 answers for CUDA without one)."""
    try:
        return torch.is_autocast_enabled("cuda")
    except TypeError:
        return torch.is_autocast_enabled()
