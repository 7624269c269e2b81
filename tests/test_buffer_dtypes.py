"""The dtype each buffer trains in under fp16/bf16 (buffer_dtypes.py; DeepSpeed itself is
compared in test_ds_conformance.py, scenario bf16_buffer_dtypes)."""
import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.testing.multiprocess import run_ranks


class Net(nn.Module):
    _keep_in_fp32_modules_strict = ["inner.kept"]

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("freq", torch.linspace(0.1, 0.9, 4) / 3)  # fp32, like inv_freq
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.inner = nn.Module()
        self.inner.register_buffer("kept", torch.ones(4, dtype=torch.bfloat16))
        self.inner.register_buffer("half_only", torch.ones(4))
        self.inner._keep_in_fp32_modules = ["half_only"]  # kept in fp32 under fp16 only

    def forward(self, x):
        return self.fc(x) * self.freq.float().to(x.dtype)


def _dtypes(rank, world, precision, data_types):
    model = Net()
    freq = model.freq
    cfg = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    if data_types:
        cfg["data_types"] = data_types
    engine, *_ = zerolite.initialize(model=model, config=cfg)
    assert engine.module.freq is freq  # cast in place: the buffer object is the user's
    return {n: str(b.dtype).removeprefix("torch.") for n, b in engine.module.named_buffers()}


@pytest.mark.parametrize("precision, data_types, expect", [
    # a buffer keeps the dtype it was built with; the model's fp32 list is upcast
    ("bf16", None, {"freq": "float32", "kept": "float32", "half_only": "float32"}),
    ("fp16", None, {"freq": "float32", "kept": "float32", "half_only": "float32"}),
    # buffer_dtype casts the rest; under bf16 `_keep_in_fp32_modules` does not apply
    ("bf16", {"buffer_dtype": "bf16"},
     {"freq": "bfloat16", "kept": "float32", "half_only": "bfloat16"}),
    ("fp16", {"buffer_dtype": "fp16"},
     {"freq": "float16", "kept": "float32", "half_only": "float32"}),
    # an explicit list replaces the model's
    ("bf16", {"buffer_dtype": "bf16", "keep_in_fp32_modules": ["freq"]},
     {"freq": "float32", "kept": "bfloat16", "half_only": "bfloat16"}),
    ("bf16", {"buffer_dtype": "bf16", "keep_in_fp32_modules": []},
     {"freq": "bfloat16", "kept": "bfloat16", "half_only": "bfloat16"}),
    # fp32 training touches nothing
    ("fp32", {"buffer_dtype": "bf16"},
     {"freq": "float32", "kept": "bfloat16", "half_only": "float32"}),
])
def test_buffer_dtypes(precision, data_types, expect):
    got = run_ranks(_dtypes, 1, precision, data_types)[0]
    assert got == {"freq": expect["freq"], "steps": "int64", "inner.kept": expect["kept"],
                   "inner.half_only": expect["half_only"]}


def test_bad_data_types_are_named():
    from zerolite.config import load_config
    from zerolite.errors import ZeroliteConfigError

    with pytest.raises(ZeroliteConfigError, match=r"data_types\.buffer_dtype"):
        load_config({"train_batch_size": 2, "data_types": {"buffer_dtype": "int8"}}, 1)
    with pytest.raises(ZeroliteConfigError, match=r"data_types\.keep_in_fp32_modules"):
        load_config({"train_batch_size": 2, "data_types": {"keep_in_fp32_modules": "x"}}, 1)
    with pytest.raises(ZeroliteConfigError, match=r"data_types\.param_dtype.*conflicts"):
        load_config({"train_batch_size": 2, "bf16": {"enabled": True},
                     "data_types": {"param_dtype": "fp16"}}, 1)
