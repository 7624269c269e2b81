"""`deepspeed.ops.lamb`: refused (LAMB's per-parameter trust ratio needs each parameter's
norm across shards, which zerolite's flat-shard optimizers do not compute)."""
import torch

from zerolite.compat.deepspeed._refused import refused_class

FusedLamb = refused_class("deepspeed.ops.lamb.FusedLamb",
                          "LAMB's per-parameter trust ratio over sharded parameters",
                          base=torch.optim.Optimizer)

__all__ = ["FusedLamb"]
