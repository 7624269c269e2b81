"""`deepspeed.moe.layer.MoE`: refused."""
import torch.nn as nn

from zerolite.compat.deepspeed._refused import refused_class

MoE = refused_class("deepspeed.moe.layer.MoE", "mixture-of-experts layers and expert parallelism",
                    base=nn.Module)
