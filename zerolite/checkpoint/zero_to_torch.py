"""DeepSpeed 0.19's `zero_to_torch.py` for zerolite checkpoints: the full model in a chosen
dtype from the per-rank shards. `engine.save_checkpoint(save_dir)` copies this file into
`save_dir` beside zero_to_fp32.py, as DeepSpeed does, so its documented command works there:

    cd save_dir && python zero_to_torch.py . output_dir --dtype bf16 [--safe_serialization]
        [--max_shard_size 5GB] [-t TAG] [--exclude_frozen_parameters]

The copy runs where zerolite is installed (it reads the shards with it).
"""
from __future__ import annotations

import sys

try:
    from zerolite.checkpoint.zero_to_fp32 import run_script
except ImportError as e:  # the copy in a checkpoint folder, run without zerolite
    sys.exit(f"zero_to_torch.py: {e}. This checkpoint was written by zerolite: run the script "
             "in an environment where zerolite is installed")


def main(argv=None) -> int:
    """DeepSpeed's command line for the script (zero_to_fp32.py's, plus a required --dtype)."""
    return run_script("zero_to_torch.py", "Consolidate a zerolite checkpoint into one model "
                      "file in float32, float16 or bfloat16 (DeepSpeed's script)", argv,
                      choose_dtype=True)


if __name__ == "__main__":
    sys.exit(main())
