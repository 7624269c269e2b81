"""DeepSpeed's `zero_to_fp32.py` for zerolite checkpoints: the full fp32 model from the per-rank
shards. `engine.save_checkpoint(save_dir)` copies this file into `save_dir` (beside `latest`
and the tag folders), as DeepSpeed does with its own, so the documented command works there:

    cd save_dir && python zero_to_fp32.py . output_dir [--safe_serialization]
        [--max_shard_size 5GB] [-t TAG] [--exclude_frozen_parameters]

Output: `pytorch_model.bin`, or with --safe_serialization `model.safetensors` (HF-style shards
and an index past --max_shard_size). The functions are also `deepspeed.utils.zero_to_fp32`'s
under the alias. The copy runs where zerolite is installed (it reads the shards with it).
"""
from __future__ import annotations

import argparse
import os
import sys

try:
    import torch

    from zerolite.checkpoint.consolidate import (DTYPES, _open, consolidate_checkpoint,
                                                  get_fp32_state_dict)
    from zerolite.checkpoint.errors import ZeroliteCheckpointError
except ImportError as e:  # the copy in a checkpoint folder, run without zerolite
    sys.exit(f"zero_to_fp32.py: {e}. This checkpoint was written by zerolite: run the script "
             "in an environment where zerolite is installed")


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict:
    """The fp32 state dict (tensors on CPU); `checkpoint_dir` holds `latest` and the tag
    folders. Frozen parameters (as the layout records them) are left out when asked."""
    sd = get_fp32_state_dict(checkpoint_dir, tag)
    if exclude_frozen_parameters:
        files = _open(checkpoint_dir, tag)
        try:
            frozen = {n for flat in files.meta["layout"] if not flat["requires_grad"]
                      for p in flat["params"] for n in p["names"]}
        finally:
            files.close()
        sd = {k: v for k, v in sd.items() if k not in frozen}
    return sd


def output_dtype(dtype) -> torch.dtype:
    """A torch dtype, or its name ("bf16", "bfloat16", "torch.bfloat16"), as DeepSpeed reads
    it; ValueError naming the choices otherwise. The names are consolidate's DTYPES, which
    are the ones DeepSpeed's zero_to_torch.py takes."""
    name = dtype
    if isinstance(dtype, str):
        dtype = DTYPES.get(dtype.removeprefix("torch.").lower())
    if dtype not in DTYPES.values():
        raise ValueError(f"unsupported output dtype {name!r}; choose one of "
                         f"{', '.join(sorted(DTYPES))}")
    return dtype


def convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype=torch.float32,
                                          max_shard_size="5GB",
                                          safe_serialization: bool = False, tag=None,
                                          exclude_frozen_parameters: bool = False) -> list:
    """Write the model in `dtype` (float32, float16 or bfloat16; integer buffers keep theirs)
    into `output_dir`: `model.safetensors` (sharded past `max_shard_size`) with
    `safe_serialization`, else `pytorch_model.bin`, as DeepSpeed 0.19's. Returns the file
    names written."""
    dtype = output_dtype(dtype)
    if safe_serialization and not exclude_frozen_parameters:
        name = next(k for k, v in DTYPES.items() if v == dtype)
        return consolidate_checkpoint(checkpoint_dir, output_dir, tag=tag, dtype=name,
                                      max_shard_size=max_shard_size)
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    os.makedirs(output_dir, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file

        save_file({k: v.contiguous().clone() for k, v in sd.items()},
                  os.path.join(output_dir, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    torch.save(sd, os.path.join(output_dir, "pytorch_model.bin"))
    return ["pytorch_model.bin"]


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization: bool = False, tag=None,
                                               exclude_frozen_parameters: bool = False) -> list:
    """convert_zero_checkpoint_to_state_dict in float32."""
    return convert_zero_checkpoint_to_state_dict(
        checkpoint_dir, output_dir, torch.float32, max_shard_size=max_shard_size,
        safe_serialization=safe_serialization, tag=tag,
        exclude_frozen_parameters=exclude_frozen_parameters)


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Load the consolidated fp32 weights into a plain (unsharded) `model`; returns it."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model


def run_script(prog: str, description: str, argv=None, choose_dtype: bool = False) -> int:
    """The command line DeepSpeed's zero_to_fp32.py and zero_to_torch.py share (the same
    positional arguments and flags; zero_to_torch.py adds the required --dtype)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("checkpoint_dir", help="the folder holding `latest` and the tag folders, "
                   "e.g. path/checkpoint-12 (`.` when run from there)")
    p.add_argument("output_dir", help="where the model files go")
    if choose_dtype:
        p.add_argument("--dtype", required=True, choices=sorted(DTYPES),
                       help="dtype of the floating-point tensors written")
    p.add_argument("--max_shard_size", default="5GB",
                   help="largest safetensors shard (with --safe_serialization), e.g. 5GB")
    p.add_argument("--safe_serialization", action="store_true",
                   help="write model.safetensors instead of pytorch_model.bin")
    p.add_argument("-t", "--tag", default=None, help="tag folder to read (default: `latest`)")
    p.add_argument("--exclude_frozen_parameters", action="store_true")
    p.add_argument("-d", "--debug", action="store_true", help="accepted; no effect")
    args = p.parse_args(argv)
    dtype = args.dtype if choose_dtype else "fp32"
    try:
        written = convert_zero_checkpoint_to_state_dict(
            args.checkpoint_dir, args.output_dir, dtype=dtype,
            max_shard_size=args.max_shard_size, safe_serialization=args.safe_serialization,
            tag=args.tag, exclude_frozen_parameters=args.exclude_frozen_parameters)
    except (ZeroliteCheckpointError, OSError) as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 1
    print(f"{prog}: wrote {', '.join(written)} ({dtype}) to {args.output_dir}")
    return 0


def main(argv=None) -> int:
    """DeepSpeed's command line for the script."""
    return run_script("zero_to_fp32.py", "Consolidate a zerolite checkpoint into one fp32 "
                      "model file (DeepSpeed's script)", argv)


if __name__ == "__main__":
    sys.exit(main())
