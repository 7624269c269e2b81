"""`deepspeed.pipe`: pipeline parallelism is refused (the names exist, building one raises)."""
import torch.nn as nn

from zerolite.compat.deepspeed._refused import refused_class

PipelineModule = refused_class("deepspeed.pipe.PipelineModule", "pipeline parallelism",
                               base=nn.Module)
LayerSpec = refused_class("deepspeed.pipe.LayerSpec", "pipeline parallelism")
TiedLayerSpec = refused_class("deepspeed.pipe.TiedLayerSpec", "pipeline parallelism")

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec"]
