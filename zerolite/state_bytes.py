"""Bytes per parameter of each model-state part, by precision mode (Adam/AdamW): what
`zerolite check-config` multiplies out per stage and offload choice, and what
engine.memory_stats() measures (tests/test_memory_estimate.py).

  mode                 compute  master          moments  compensation  grad shard
  fp32                 4        the shard (0)   8        0             4
  mixed (fp16 / bf16)  2        4               8        0             4
  bf16 masters         2        the shard (0)   8 (fp32) 0             2
  bf16 masters+states  2        the shard (0)   4        2 if kahan    2

"bf16 masters" are `bf16.bf16_master_weights_and_grads` (a bf16 master of a bf16 shard IS
the shard); "+states" adds `bf16.bf16_optimizer_states`; the compensation is
`zerolite.master_rounding: "kahan"`'s buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("fp32", "mixed", "bf16_masters", "bf16_masters_states")


@dataclass(frozen=True)
class StateBytes:
    compute: int
    """The compute-dtype param shard."""
    master: int
    """A master kept apart from the shard (0 where the master IS the shard)."""
    moments: int
    """Adam's exp_avg + exp_avg_sq."""
    compensation: int
    """The Kahan buffer of bf16 masters."""
    grad: int
    """A reduced gradient shard (the master's dtype)."""

    @property
    def master_is_shard(self) -> bool:
        return self.master == 0

    @property
    def optimizer(self) -> int:
        """Master (apart from the shard) + moments + compensation."""
        return self.master + self.moments + self.compensation


def state_bytes(mode: str, *, compensation: bool = False) -> StateBytes:
    """The layout of `mode` (one of MODES; fp16/bf16 mean "mixed"); `compensation` adds the
    Kahan buffer (bf16 master modes only)."""
    mode = {"fp16": "mixed", "bf16": "mixed"}.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"precision must be one of {sorted(MODES + ('fp16', 'bf16'))}, "
                         f"got {mode!r}")
    if compensation and not mode.startswith("bf16_masters"):
        raise ValueError(f"compensation applies to bf16 masters, not to {mode!r}")
    comp = 2 if compensation else 0
    return {"fp32": StateBytes(4, 0, 8, 0, 4),
            "mixed": StateBytes(2, 4, 8, 0, 4),
            "bf16_masters": StateBytes(2, 0, 8, comp, 2),
            "bf16_masters_states": StateBytes(2, 0, 4, comp, 2)}[mode]


def mode_of(cfg) -> tuple[str, bool]:
    """(mode, compensation) of a ZeroConfig."""
    b = cfg.bf16
    if b.bf16_master_weights_and_grads:
        return (("bf16_masters_states" if b.bf16_optimizer_states else "bf16_masters"),
                cfg.zerolite.master_rounding == "kahan")
    return ("fp32" if not (b.enabled or cfg.fp16.enabled) else "mixed"), False
