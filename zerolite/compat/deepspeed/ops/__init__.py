"""`deepspeed.ops`: DeepSpeed's optimizer classes as torch optimizers zerolite steps over
its fp32 shards (same arguments, same math as the per-parameter update)."""
from zerolite.compat.deepspeed.ops import adagrad, adam, lamb, lion  # noqa: F401

__all__ = ["adam", "adagrad", "lion", "lamb"]
