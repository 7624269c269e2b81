"""Run a client script under real DeepSpeed on a CPU machine as it runs on a GPU machine.

    torchrun --nproc_per_node 2 under_deepspeed.py SCRIPT [ARGS...]

On a GPU machine Accelerate (and so the Hugging Face Trainer and TRL) sees DeepSpeed and calls
`deepspeed.init_distributed()` itself. On the CPU it takes its multi-CPU path, which starts
torch.distributed but not `deepspeed.comm`, and DeepSpeed's `zero.Init` then takes the world to
be one process. This starts `deepspeed.comm` on gloo first, as Accelerate does on a GPU machine,
and runs the script unchanged. Only tests/test_ds_clients.py uses it, for the DeepSpeed side.
"""
import runpy
import sys

import deepspeed

deepspeed.init_distributed(dist_backend="gloo")
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
