"""DeepSpeed 0.19's `zero_to_torch.py` for zerolite checkpoints: the full model in a chosen
dtype from the per-rank shards. `engine.save_checkpoint(save_dir)` copies this file into
`save_dir` beside zero_to_fp32.py, as DeepSpeed does, so its documented command works there:

    cd save_dir && python zero_to_torch.py . output_dir --dtype bf16 [--safe_serialization]
        [--max_shard_size 5GB] [-t TAG] [--exclude_frozen_parameters]

The copy runs where zerolite is installed (it reads the shards with it).
"""
from __future__ import annotations

import argparse
import sys

try:
    from zerolite.checkpoint.errors import ZeroliteCheckpointError
    from zerolite.checkpoint.zero_to_fp32 import (OUTPUT_DTYPES,
                                                  convert_zero_checkpoint_to_state_dict)
except ImportError as e:  # the copy in a checkpoint folder, run without zerolite
    sys.exit(f"zero_to_torch.py: {e}. This checkpoint was written by zerolite: run the script "
             "in an environment where zerolite is installed")


def main(argv=None) -> int:
    """DeepSpeed's command line for the script (same positional arguments and flags)."""
    p = argparse.ArgumentParser(prog="zero_to_torch.py", description="Consolidate a zerolite "
                                "checkpoint into one model file in float32, float16 or bfloat16 "
                                "(DeepSpeed's script)")
    p.add_argument("checkpoint_dir", help="the folder holding `latest` and the tag folders, "
                   "e.g. path/checkpoint-12 (`.` when run from there)")
    p.add_argument("output_dir", help="where the model files go")
    p.add_argument("--dtype", required=True, choices=sorted(OUTPUT_DTYPES),
                   help="dtype of the floating-point tensors written")
    p.add_argument("--max_shard_size", default="5GB",
                   help="largest safetensors shard (with --safe_serialization), e.g. 5GB")
    p.add_argument("--safe_serialization", action="store_true",
                   help="write model.safetensors instead of pytorch_model.bin")
    p.add_argument("-t", "--tag", default=None, help="tag folder to read (default: `latest`)")
    p.add_argument("--exclude_frozen_parameters", action="store_true")
    p.add_argument("-d", "--debug", action="store_true", help="accepted; no effect")
    args = p.parse_args(argv)
    try:
        written = convert_zero_checkpoint_to_state_dict(
            args.checkpoint_dir, args.output_dir, dtype=args.dtype,
            max_shard_size=args.max_shard_size, safe_serialization=args.safe_serialization,
            tag=args.tag, exclude_frozen_parameters=args.exclude_frozen_parameters)
    except (ZeroliteCheckpointError, OSError) as e:
        sys.stderr.write(f"zero_to_torch.py: error: {e}\n")
        return 1
    print(f"zero_to_torch.py: wrote {', '.join(written)} ({args.dtype}) to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
