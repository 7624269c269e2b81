"""DeepSpeed's optimizer classes (`deepspeed.ops.adam.FusedAdam`, `DeepSpeedCPUAdam`, ...) as
torch / zerolite optimizers: what a user constructs from `deepspeed.ops`, and what a config's
`optimizer.type` builds (optim/builder.py picks the class by DeepSpeed's rule).

[Note: subclasses, not fused kernels] The engine steps a client optimizer itself over the flat
fp32 shards (zerolite/optim/param_groups.py), and the NVMe offload builds an inner one of the
same class from its `defaults` (offload/chunked_optimizer.py), so each class is a torch
optimizer subclass whose constructor takes DeepSpeed's arguments and records the
DeepSpeed-only ones in `defaults`. The update is the element-wise one DeepSpeed's kernels
compute. With bf16 master weights (bf16.bf16_master_weights_and_grads) the Adam classes step
through zerolite/optim/master_update.py instead: fp32 maths stored in bf16 with the rounding
given as `master_rounding`, and DeepSpeedCPUAdam's `fp32_optimizer_states` chooses the
dtype of its moments, as in DeepSpeed.
"""
from __future__ import annotations

import torch

from zerolite.errors import DeepSpeedFeatureNotSupported
from zerolite.errors import not_supported_message as message
from zerolite.optim.flat_optimizers import Lion
from zerolite.optim.master_update import LowPrecisionAdamStep, check_rounding


def _check_bias_correction(cls: str, bias_correction: bool) -> None:
    if not bias_correction:
        raise DeepSpeedFeatureNotSupported(message(
            f"deepspeed.ops.adam.{cls}(bias_correction=False)",
            "Adam without bias correction; torch's Adam always corrects"))


class FusedAdam(LowPrecisionAdamStep, torch.optim.Adam):
    """`FusedAdam(params, lr, bias_correction, betas, eps, adam_w_mode, weight_decay, amsgrad,
    set_grad_none)`: AdamW when `adam_w_mode` (DeepSpeed's default), else Adam with L2.
    `fused` is torch's switch (not DeepSpeed's): the engine turns it on for host masters.
    `master_rounding` (zerolite's): how bf16 masters are stored (master_update.py)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True, *,
                 fused: bool | None = None, master_rounding: str = "nearest"):
        _check_bias_correction(type(self).__name__, bias_correction)
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, decoupled_weight_decay=bool(adam_w_mode), fused=fused)
        self.defaults.update(adam_w_mode=bool(adam_w_mode), bias_correction=True,
                             set_grad_none=set_grad_none,
                             master_rounding=check_rounding(master_rounding))
        for group in self.param_groups:
            group.setdefault("master_rounding", master_rounding)


class DeepSpeedCPUAdam(LowPrecisionAdamStep, torch.optim.Adam):
    """`DeepSpeedCPUAdam(model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad,
    adamw_mode, fp32_optimizer_states)`: AdamW when `adamw_mode` (default), else Adam.
    `fp32_optimizer_states=False` keeps the moments of bf16 masters in bf16;
    `master_rounding` (zerolite's): how bf16 masters are stored (master_update.py)."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True,
                 fp32_optimizer_states=True, *, master_rounding: str = "nearest"):
        _check_bias_correction(type(self).__name__, bias_correction)
        super().__init__(model_params, lr=lr, betas=tuple(betas), eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad,
                         decoupled_weight_decay=bool(adamw_mode), fused=True)
        # Note: fused=True is torch's fused CPU kernel (see [Note: fused CPU Adam] in
        # zerolite/optim/builder.py); DeepSpeed's class is a fused CPU kernel too.
        self.defaults.update(adamw_mode=bool(adamw_mode), bias_correction=True,
                             fp32_optimizer_states=fp32_optimizer_states,
                             master_rounding=check_rounding(master_rounding))
        for group in self.param_groups:
            group.setdefault("master_rounding", master_rounding)

    def state_dtype(self, param: torch.Tensor) -> torch.dtype:
        return torch.float32 if self.defaults["fp32_optimizer_states"] else param.dtype

    def add_param_group(self, param_group: dict) -> None:
        # DeepSpeed's class refuses AMSGrad for the constructor's and any later group.
        if param_group.get("amsgrad", self.defaults["amsgrad"]):
            raise DeepSpeedFeatureNotSupported(message(
                "deepspeed.ops.adam.DeepSpeedCPUAdam(amsgrad=True)",
                "DeepSpeed itself rejects the AMSGrad variant for CPU Adam"))
        super().add_param_group(param_group)


class DeepSpeedCPUAdagrad(torch.optim.Adagrad):
    """`DeepSpeedCPUAdagrad(model_params, lr, eps, weight_decay, amsgrad, fp32_optimizer_states)`."""

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                 fp32_optimizer_states=True):
        if amsgrad:
            raise DeepSpeedFeatureNotSupported(message(
                "deepspeed.ops.adagrad.DeepSpeedCPUAdagrad(amsgrad=True)",
                "DeepSpeed itself rejects amsgrad for Adagrad"))
        super().__init__(model_params, lr=lr, eps=eps, weight_decay=weight_decay)
        self.defaults.update(amsgrad=False, fp32_optimizer_states=fp32_optimizer_states)


class DeepSpeedCPULion(Lion):
    """`DeepSpeedCPULion(model_params, lr, betas, weight_decay, fp32_optimizer_states)`."""

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0,
                 fp32_optimizer_states=True):
        super().__init__(model_params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        self.defaults.update(fp32_optimizer_states=fp32_optimizer_states)


class FusedLion(Lion):
    """`FusedLion(params, lr, betas, weight_decay, set_grad_none)`."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0,
                 set_grad_none=True):
        super().__init__(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        self.defaults.update(set_grad_none=set_grad_none)
