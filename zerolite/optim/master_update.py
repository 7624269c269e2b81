"""The Adam/AdamW step on bf16 master weights (`bf16.bf16_master_weights_and_grads`), with the
rounding `zerolite.master_rounding` chooses.

With bf16 masters the update is computed in fp32 and only stored in bf16, as DeepSpeed's fused
kernels do; what differs is how the fp32 result is stored (triton_kernels/adamw_ref.py
defines the numerics, triton_kernels/dispatch.py runs the Triton kernel on CUDA):

  nearest     round to nearest: DeepSpeed's behaviour. An update smaller than half a bf16
              ulp of the weight (|w| * 2^-9) is lost every step, so late in training, with a
              small learning rate, weights stop moving.
  kahan       a bf16 compensation buffer per master ("master_compensation" in the optimizer
              state) keeps what each rounding dropped and adds it back at the next step: the
              master + compensation pair carries ~16 significant bits. 2 bytes per parameter.
  stochastic  round up or down with probability by distance (unbiased on average); no memory.

[Note: which optimizers compensate] The rounding is an argument of the optimizer classes
zerolite builds from a config's `optimizer` block (FusedAdam, DeepSpeedCPUAdam), given when
the engine builds them. An optimizer object the user built updates bf16 masters the way its
own code does (torch's Adam computes in bf16; our classes round to nearest unless told
otherwise); the engine says so in a warning rather than changing the object.

The mixin keeps torch's state names (`step`, `exp_avg`, `exp_avg_sq`) so checkpoints,
`safe_get_full_optimizer_state` and a later load into fp32 masters see what they expect.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from zerolite.config.sections import MASTER_ROUNDINGS as ROUNDINGS
from zerolite.errors import ZeroliteConfigError

COMPENSATION = "master_compensation"


def check_rounding(rounding: str) -> str:
    if rounding not in ROUNDINGS:
        raise ValueError(f"master_rounding: got {rounding!r}; expected one of {ROUNDINGS}")
    return rounding


def _seed(step: int, index: int, rank: int) -> int:
    """A different random stream per step, master and rank (stochastic rounding)."""
    return (step * 1_000_003 + index * 7_919 + rank * 104_729) & 0x7FFFFFFF


class LowPrecisionAdamStep:
    """Mixin for torch.optim.Adam subclasses: `step()` runs the fused update of
    triton_kernels when any parameter is not fp32 (bf16 masters), torch's own otherwise."""

    def state_dtype(self, param: torch.Tensor) -> torch.dtype:
        """dtype of exp_avg / exp_avg_sq for `param`: the param's own (DeepSpeed's fused
        kernels keep state like the param); DeepSpeedCPUAdam overrides it."""
        return param.dtype

    def state_entry_dtype(self, param: torch.Tensor, name: str) -> torch.dtype:
        """dtype of state entry `name` of `param` (the compensation has the master's)."""
        return param.dtype if name == COMPENSATION else self.state_dtype(param)

    def _has_low_precision_params(self) -> bool:
        return any(p.dtype != torch.float32 for g in self.param_groups for p in g["params"])

    @torch.no_grad()
    def step(self, closure=None):
        if not self._has_low_precision_params():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        from triton_kernels.dispatch import adamw_step

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        index = 0
        for group in self.param_groups:
            self._check_group(group)
            beta1, beta2 = group["betas"]
            rounding = group.get("master_rounding", "nearest")
            decoupled = bool(group.get("decoupled_weight_decay", False))
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                state = self._state_for(p, rounding)
                state["step"] += 1
                step = int(state["step"].item())
                low = p.dtype != torch.float32
                adamw_step(p.detach().view(-1), p.grad.detach().view(-1),
                           state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1),
                           state[COMPENSATION].view(-1) if low and rounding == "kahan" else None,
                           step=step, lr=float(group["lr"]), beta1=float(beta1),
                           beta2=float(beta2), eps=float(group["eps"]),
                           weight_decay=float(group["weight_decay"]), adamw=decoupled,
                           rounding=rounding if low else "nearest",
                           seed=_seed(step, index, rank))
        return loss

    def _state_for(self, p: torch.Tensor, rounding: str) -> dict:
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.tensor(0.0)
            dtype = self.state_dtype(p)
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype,
                                                   memory_format=torch.preserve_format)
        if rounding == "kahan" and p.dtype != torch.float32 and COMPENSATION not in state:
            # also after loading a checkpoint saved without one: it starts at zero
            state[COMPENSATION] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @staticmethod
    def _check_group(group: dict) -> None:
        for key in ("amsgrad", "maximize", "capturable", "differentiable"):
            if group.get(key):
                raise ZeroliteConfigError(
                    f"optimizer param group {key}=True is not supported with "
                    "bf16.bf16_master_weights_and_grads (the bf16 master update is plain "
                    "Adam/AdamW); turn it off or keep fp32 masters")
        check_rounding(group.get("master_rounding", "nearest"))


def state_entry_dtype(optimizer, param: torch.Tensor, name: str) -> torch.dtype:
    """dtype of `optimizer`'s per-element state entry `name` for `param` before it exists
    (a checkpoint load into a fresh optimizer): what our classes choose, else the param's
    own (torch optimizers make their state with zeros_like)."""
    if isinstance(optimizer, LowPrecisionAdamStep):
        return optimizer.state_entry_dtype(param, name)
    return param.dtype
