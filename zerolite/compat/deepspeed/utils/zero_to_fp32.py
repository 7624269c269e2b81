"""`deepspeed.utils.zero_to_fp32` over zerolite checkpoints: the full fp32 model from the
per-rank shards (`checkpoint_dir` holds `latest` and the tag folders, as DeepSpeed's). The code
is zerolite/checkpoint/zero_to_fp32.py, the script every checkpoint folder gets a copy of."""
from zerolite.checkpoint.consolidate import DTYPES as OUTPUT_DTYPE_NAMES  # noqa: F401
from zerolite.checkpoint.zero_to_fp32 import (  # noqa: F401
    convert_zero_checkpoint_to_fp32_state_dict,
    convert_zero_checkpoint_to_state_dict, get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint, main,
)
from zerolite.compat.deepspeed._refused import refused_function

# Lightning's convert_zero_checkpoint_to_fp32_state_dict torch.loads the files these name.
_PT_FILES = ("DeepSpeed's pickled *_model_states.pt / *_optim_states.pt files (a zerolite "
             "checkpoint is safetensors + meta.json; for the weights use "
             "deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict or the "
             "checkpoint's zero_to_fp32.py)")
get_optim_files = refused_function("deepspeed.utils.zero_to_fp32.get_optim_files", _PT_FILES)
get_model_state_file = refused_function("deepspeed.utils.zero_to_fp32.get_model_state_file",
                                        _PT_FILES)

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
           "convert_zero_checkpoint_to_state_dict", "load_state_dict_from_zero_checkpoint"]
