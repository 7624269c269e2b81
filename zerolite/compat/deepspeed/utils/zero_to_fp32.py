"""`deepspeed.utils.zero_to_fp32` over zerolite checkpoints: the full fp32 model from the
per-rank shards (`checkpoint_dir` holds `latest` and the tag folders, as DeepSpeed's). The code
is zerolite/checkpoint/zero_to_fp32.py, the script every checkpoint folder gets a copy of."""
from zerolite.checkpoint.zero_to_fp32 import (  # noqa: F401
    convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint, main,
)

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
           "load_state_dict_from_zero_checkpoint"]
