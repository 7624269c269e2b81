"""`deepspeed.checkpoint`: only its `utils` helpers (DeepSpeed's universal-checkpoint tools
are not provided; zerolite checkpoints reshard on load by themselves)."""
from zerolite.compat.deepspeed.checkpoint import utils  # noqa: F401

from zerolite.compat.deepspeed._refused_names import refused_stubs  # noqa: E402

globals().update(refused_stubs("deepspeed.checkpoint"))
