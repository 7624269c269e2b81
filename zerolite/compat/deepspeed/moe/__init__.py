"""`deepspeed.moe`: mixture-of-experts is refused; its helpers work for models without MoE
(DeepSpeed's CIFAR example imports them with MoE off)."""
