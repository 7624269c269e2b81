"""The dtype each floating-point buffer of the model trains in, by DeepSpeed 0.19's rules.

[Note: buffers keep their dtype] Under fp16/bf16 the parameters take the training dtype (the
flats do that); a buffer keeps the dtype it was built or loaded with, as in DeepSpeed >= 0.19
(which stopped calling `module.half()` / `.bfloat16()`), so an fp32 buffer such as a rotary
embedding's `inv_freq` stays fp32, as the model's own code expects. Two config keys change
that: `data_types.buffer_dtype` casts every floating buffer to that dtype, and
`data_types.keep_in_fp32_modules` names buffers that stay (or become) fp32 whatever else
happens: by default ("auto") the ones transformers lists in a model's
`_keep_in_fp32_modules_strict` (and, under fp16, `_keep_in_fp32_modules`). In fp32 training
nothing is touched.
"""
from __future__ import annotations

import re

import torch
import torch.nn as nn

from zerolite.config import TORCH_DTYPES

_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fp32_buffer_pattern(module: nn.Module, setting, training_dtype: torch.dtype):
    """The compiled pattern of buffer names to keep in fp32, or None when there are none.

    `setting` is data_types.keep_in_fp32_modules: "auto" (the model's transformers lists) or
    a list of name patterns, where `*` stands for any characters and a pattern may match
    anywhere in a buffer's full name (transformers' rule)."""
    if training_dtype not in (torch.float16, torch.bfloat16):
        return None
    if setting == "auto":
        patterns = set()
        for prefix, sub in module.named_modules():
            names = set(getattr(sub, "_keep_in_fp32_modules_strict", None) or ())
            if training_dtype == torch.float16:
                names |= set(getattr(sub, "_keep_in_fp32_modules", None) or ())
            for name in names:
                body = name.replace("*", ".*")
                patterns.add(rf"^{re.escape(prefix)}\..*{body}" if prefix else body)
    else:
        patterns = {name.replace("*", ".*") for name in setting}
    return re.compile("|".join(sorted(patterns))) if patterns else None


def set_buffer_dtypes(module: nn.Module, training_dtype: torch.dtype, data_types) -> None:
    """Give every floating buffer of `module` its dtype (see the module docstring), in place:
    the buffer objects stay the same, only their data changes."""
    if training_dtype not in (torch.float16, torch.bfloat16):
        return
    pattern = fp32_buffer_pattern(module, data_types.keep_in_fp32_modules, training_dtype)
    cast_to = None if data_types.buffer_dtype is None else TORCH_DTYPES[data_types.buffer_dtype]
    for prefix, sub in module.named_modules():
        for name, buf in sub.named_buffers(recurse=False):
            if buf is None or buf.dtype not in _FLOATING:
                continue
            full = f"{prefix}.{name}" if prefix else name
            want = torch.float32 if pattern is not None and pattern.search(full) else cast_to
            if want is not None and buf.dtype != want:
                buf.data = buf.data.to(want)
