"""`deepspeed.checkpoint`: only its `utils` helpers (DeepSpeed's universal-checkpoint tools
are not provided; zerolite checkpoints reshard on load by themselves)."""
from zerolite.compat.deepspeed.checkpoint import utils  # noqa: F401
