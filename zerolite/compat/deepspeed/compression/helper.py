"""`deepspeed.compression.helper`: DeepSpeed 0.19's deprecated shim for DeepSpeed-Chat's
`from deepspeed.compression.helper import recursive_getattr, recursive_setattr`. It warns, as
DeepSpeed's does, and gives deepspeed.utils.module_utils' helpers."""
import warnings

from zerolite.compat.deepspeed.utils.module_utils import recursive_getattr, recursive_setattr

warnings.warn("deepspeed.compression.helper is deprecated (as in DeepSpeed 0.19): import "
              "recursive_getattr and recursive_setattr from deepspeed.utils.module_utils",
              FutureWarning, stacklevel=2)

__all__ = ["recursive_getattr", "recursive_setattr"]
