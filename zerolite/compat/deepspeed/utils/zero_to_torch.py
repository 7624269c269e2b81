"""`deepspeed.utils.zero_to_torch`: the command line of the zero_to_torch.py script DeepSpeed
0.19 copies into checkpoint folders (zerolite/checkpoint/zero_to_torch.py)."""
from zerolite.checkpoint.zero_to_torch import main  # noqa: F401

__all__ = ["main"]
