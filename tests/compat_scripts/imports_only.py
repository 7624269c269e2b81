"""A DeepSpeed program's import lines and first calls, unchanged; writes what it saw to
--out/rank<N>.json (run by tests/test_compat_entrypoints.py)."""
import argparse
import importlib.metadata
import json
import os
import sys

import deepspeed
import torch
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: F401
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam  # noqa: F401
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: F401
from deepspeed.runtime.zero import partition_parameters  # noqa: F401
from deepspeed.utils import logger  # noqa: F401


class WhichDeepSpeed(torch.utils.data.Dataset):
    """Answers, inside a dataloader worker process, which deepspeed that process imports."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        import deepspeed as ds_in_worker

        meta = importlib.metadata.metadata("deepspeed")
        return f"{meta['Version']}|{meta.get('Provides-Alias-Of')}|{ds_in_worker.__version__}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed()
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)], device=get_accelerator().current_device_name())
    dist.all_reduce(total)
    meta = importlib.metadata.metadata("deepspeed")
    seen = {"rank": rank, "world": dist.get_world_size(), "local_rank_arg": args.local_rank,
            "env_local_rank": int(os.environ["LOCAL_RANK"]), "sum": total.item(),
            "version": deepspeed.__version__, "dist_version": meta["Version"],
            "marker": meta.get("Provides-Alias-Of"), "file": deepspeed.__file__,
            "device_name": get_accelerator().device_name(rank),
            "backend": get_accelerator().communication_backend_name(),
            "pythonpath": os.environ.get("PYTHONPATH", ""), "argv": sys.argv}
    if rank == 0:  # a spawned (not forked) worker starts from PYTHONPATH, not our sys.path
        loader = torch.utils.data.DataLoader(WhichDeepSpeed(), num_workers=1,
                                             multiprocessing_context="spawn")
        seen["worker"] = next(iter(loader))[0]
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
