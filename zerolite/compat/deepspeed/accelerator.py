"""`deepspeed.accelerator.get_accelerator()`: the device calls DeepSpeed scripts make, over
CUDA when it is available and the CPU otherwise (the device zerolite's engine picks)."""
from __future__ import annotations

import os

import torch


class ZeroliteAccelerator:
    """DeepSpeed's accelerator interface (the subset scripts and libraries call)."""

    def __init__(self, name: str):
        self._name = name
        self._communication_backend_name = "nccl" if name == "cuda" else "gloo"

    # -- device names --------------------------------------------------------------------
    def device_name(self, device_index=None) -> str:
        if self._name == "cpu" or device_index is None:
            return self._name
        return f"{self._name}:{int(device_index)}"

    def current_device_name(self) -> str:
        if self._name == "cpu":
            return "cpu"
        return f"cuda:{torch.cuda.current_device()}"

    def device(self, device_index=None):
        return torch.device(self.device_name(device_index))

    def current_device(self):
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def set_device(self, device_index) -> None:
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    def device_count(self) -> int:
        if self._name == "cuda":
            return torch.cuda.device_count()
        # DeepSpeed's CPU accelerator: LOCAL_SIZE (its launcher sets it) when positive; then
        # torchrun's LOCAL_WORLD_SIZE here (DeepSpeed counts NUMA nodes instead).
        for key in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
            count = int(os.environ.get(key, 0) or 0)
            if count > 0:
                return count
        return 1

    def is_available(self) -> bool:
        return True

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    def is_synchronized_device(self) -> bool:
        return self._name == "cpu"

    # -- capabilities ---------------------------------------------------------------------
    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self) -> bool:
        return self._name == "cuda"

    def supported_dtypes(self) -> list:
        out = [torch.float32, torch.bfloat16] if self.is_bf16_supported() else [torch.float32]
        return out + ([torch.float16] if self.is_fp16_supported() else [])

    # -- synchronisation and memory -----------------------------------------------------------
    def synchronize(self, device_index=None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None) -> int:
        if self._name == "cuda":
            return torch.cuda.memory_allocated(device_index)
        import psutil

        return psutil.Process().memory_info().rss

    def max_memory_allocated(self, device_index=None) -> int:
        if self._name == "cuda":
            return torch.cuda.max_memory_allocated(device_index)
        return self.memory_allocated(device_index)

    def reset_peak_memory_stats(self, device_index=None) -> None:
        if self._name == "cuda":
            torch.cuda.reset_peak_memory_stats(device_index)

    def total_memory(self, device_index=None) -> int:
        if self._name == "cuda":
            return torch.cuda.get_device_properties(device_index or 0).total_memory
        import psutil

        return psutil.virtual_memory().total

    # -- RNG -----------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        if self._name == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        if self._name == "cuda":
            torch.cuda.manual_seed_all(seed)
        else:
            torch.manual_seed(seed)

    def random(self):
        return torch.random

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if self._name == "cuda" else tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if self._name == "cuda" else False

    def __repr__(self) -> str:
        return f"ZeroliteAccelerator({self._name!r})"


DeepSpeedAccelerator = ZeroliteAccelerator
"""DeepSpeed's accelerator base class: `isinstance(get_accelerator(), DeepSpeedAccelerator)`."""

_ACCELERATOR: ZeroliteAccelerator | None = None

SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa",
                              "klxpu"]
"""DeepSpeed 0.19's accelerator names (zerolite itself runs on cuda and cpu only)."""


def is_current_accelerator_supported() -> bool:
    return get_accelerator().device_name() in SUPPORTED_ACCELERATOR_LIST


def get_accelerator() -> ZeroliteAccelerator:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = ZeroliteAccelerator("cuda" if torch.cuda.is_available() else "cpu")
    return _ACCELERATOR


def set_accelerator(accel) -> None:
    global _ACCELERATOR
    _ACCELERATOR = accel


__all__ = ["get_accelerator", "set_accelerator", "is_current_accelerator_supported",
           "ZeroliteAccelerator"]
