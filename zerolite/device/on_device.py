"""`OnDevice`: build a module's tensors on a chosen device and floating dtype (DeepSpeed's
`deepspeed.OnDevice`), e.g. on the meta device to read its shapes without allocating, or
directly on the GPU in half precision.

    with OnDevice(dtype=torch.bfloat16, device="meta"):
        model = MyModel()     # every parameter is a bf16 meta tensor

[Note: the constructors DeepSpeed redirects, through a mode] Inside the context the tensor
constructors `torch.empty`, `zeros`, `ones` and `full` put their result on `device` when the
call names no device, and cast a floating-point result to `dtype` (also when the call named a
dtype, as DeepSpeed's does); that is what `nn.Module` constructors use for their parameters.
Other calls are left alone. The redirection is a TorchFunctionMode, not a rebinding of
`torch.empty`, so code that saved a reference to a constructor before the context, other
threads, and anything after the context are unaffected.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_CONSTRUCTORS = frozenset({torch.empty, torch.zeros, torch.ones, torch.full})


class _ConstructorMode(TorchFunctionMode):
    def __init__(self, device: torch.device, dtype: torch.dtype | None):
        super().__init__()
        self.device, self.dtype = device, dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func not in _CONSTRUCTORS:
            return func(*args, **kwargs)
        if kwargs.get("device") is None:
            kwargs["device"] = self.device
        out = func(*args, **kwargs)
        if self.dtype is not None and out.is_floating_point() and out.dtype != self.dtype:
            out = out.to(self.dtype)
        return out


class OnDevice:
    """Create modules and tensors on `device` with floating dtype `dtype` (DeepSpeed's
    signature: `OnDevice(dtype, device="meta", enabled=True)`; `dtype=None` keeps each
    tensor's own dtype). `enabled=False` makes the context a no-op."""

    def __init__(self, dtype: torch.dtype | None, device="meta", enabled: bool = True):
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"OnDevice(dtype={dtype!r}): expected a floating-point torch.dtype "
                            "or None")
        self.dtype = dtype
        self.device = torch.device(device)
        self.enabled = enabled
        self._mode: _ConstructorMode | None = None

    def __enter__(self):
        if self.enabled:
            self._mode = _ConstructorMode(self.device, self.dtype)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(*exc)
        return False
