"""`deepspeed.runtime.activation_checkpointing`: `checkpointing` is zerolite.checkpointing."""
from zerolite import checkpointing  # noqa: F401
