"""`zero_optimization.offload_optimizer` and `offload_param` as typed, validated dataclasses.

DeepSpeed's key names and defaults. A key DeepSpeed does not define is refused (as DeepSpeed's
own config model does), naming its JSON path; DeepSpeed keys that change nothing in zerolite
are accepted and documented as such on their field. zerolite/offload/plan.py turns these into
one placement per flat.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from ._util import check_bool, check_float, check_int, check_object, check_str, fail, join

Device = Literal["cpu", "nvme"]


@dataclass(frozen=True)
class _OffloadBlock:
    _KEY: ClassVar[str] = ""

    device: Device = "cpu"
    """Where the offloaded tensors live: host memory ("cpu") or files under `nvme_path`."""
    nvme_path: str | None = None
    """Directory of the swap files (device "nvme"; required there)."""
    pin_memory: bool = False
    """Page-lock the host buffers (faster copies to an accelerator; a no-op on CPU)."""

    def __getitem__(self, key: str):
        """DeepSpeed-style `block["device"]` reads (user code and the engine accessors)."""
        if key not in {f.name for f in fields(self)}:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    @classmethod
    def parse(cls, path: str, v: Any):
        """Validate a block; device "none" (or a null block) means no offload -> None."""
        if v is None:
            return None
        check_object(path, v)
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in v.items():
            kp = join(path, key)
            if key == "pipeline" and "pipeline" not in known:
                key = None  # DeepSpeed's old spelling of pipeline_read/write: ignored as they are
            elif key not in known:
                fail(kp, value, f"one of the keys of {path} ({', '.join(sorted(known))})")
            if key is None:
                check_bool(kp, value)
                continue
            default = known[key].default
            if key == "device":
                value = check_str(kp, value.lower() if isinstance(value, str) else value,
                                  choices=("none", "cpu", "nvme"))
            elif key == "nvme_path":
                value = check_str(kp, value, none_ok=True)
            elif isinstance(default, bool):
                value = check_bool(kp, value)
            elif isinstance(default, int):
                value = check_int(kp, value, ge=0)
            elif key == "ratio":
                value = check_float(kp, value, gt=0, le=1)
            elif isinstance(default, float):
                value = check_float(kp, value, ge=0)
            values[key] = value
        if values.get("device", "none") == "none":
            return None
        if values["device"] == "nvme" and not values.get("nvme_path"):
            fail(join(path, "nvme_path"), values.get("nvme_path"),
                 "a directory path when device is 'nvme'")
        return cls(**values)


@dataclass(frozen=True)
class OffloadOptimizerConfig(_OffloadBlock):
    """`zero_optimization.offload_optimizer` (zerolite/offload/)."""

    _KEY: ClassVar[str] = "offload_optimizer"

    buffer_count: int = 4
    """DeepSpeed's swap buffer count; zerolite always uses two chunk buffer sets (accepted,
    no effect)."""
    pipeline_read: bool = False
    """DeepSpeed's overlapped swap-in; zerolite always reads the next chunk ahead."""
    pipeline_write: bool = False
    """DeepSpeed's overlapped swap-out; zerolite always writes behind."""
    fast_init: bool = False
    """DeepSpeed's faster swap-file initialisation (accepted, no effect)."""
    ratio: float = 1.0
    """Fraction of the optimized elements offloaded (in model order); stage 3 when < 1."""
    super_offload: bool = False
    """DeepSpeed's SuperOffload (not implemented: must stay false)."""
    cpuadam_cores_perc: float = 0.8
    """DeepSpeed's CPU-Adam core share (accepted, no effect: torch picks its threads)."""


@dataclass(frozen=True)
class OffloadParamConfig(_OffloadBlock):
    """`zero_optimization.offload_param` (stage 3; zerolite/offload/)."""

    _KEY: ClassVar[str] = "offload_param"

    buffer_count: int = 5
    """nvme: how many units' shards are read ahead of their gather."""
    buffer_size: int = 100_000_000
    """DeepSpeed's swap buffer size (accepted, no effect: each shard is read whole)."""
    max_in_cpu: int = 1_000_000_000
    """DeepSpeed's bound on params kept in host memory (accepted, no effect)."""


_BLOCKS = {"offload_optimizer": OffloadOptimizerConfig, "offload_param": OffloadParamConfig}


def parse_offload(path: str, name: str, v: Any):
    """Validate the offload block `name` at `path`: its typed config, or None (no offload)."""
    block = _BLOCKS[name].parse(path, v)
    if isinstance(block, OffloadOptimizerConfig) and block.super_offload:
        fail(join(path, "super_offload"), True, "false (SuperOffload is not implemented)")
    return block


@dataclass(frozen=True)
class OffloadConfig:
    """What zerolite/offload/plan.py reads: both blocks and the chunk size."""

    optimizer: OffloadOptimizerConfig | None = None
    param: OffloadParamConfig | None = None
    sub_group_size: int = 1_000_000_000
    """Elements per chunk of the optimizer step when offload_optimizer.device is nvme."""

    @classmethod
    def from_zero(cls, zc) -> "OffloadConfig":
        """From a validated ZeroOptimizationConfig."""
        return cls(zc.offload_optimizer, zc.offload_param, int(zc.sub_group_size))
