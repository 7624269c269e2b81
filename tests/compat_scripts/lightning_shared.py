"""What lightning_tiny.py (the Trainer) and fabric_tiny.py (Fabric) share: their common
options, the gathered weights they record, and `cpu_as_cuda`.

[Note: a CUDA accelerator that places on CPU] Lightning's DeepSpeedStrategy (Trainer and
Fabric alike) refuses any accelerator that is not its CUDAAccelerator. `cpu_as_cuda(base)`
subclasses the given CUDAAccelerator (the Trainer's and Fabric's are different classes) so it
places on CPU, and the program and Lightning's strategy run unchanged on a machine without a
GPU. On a GPU the scripts leave it out."""
import argparse

import torch


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--stage", type=int, default=0, help="ZeRO stage; 0: the plain reference")
    p.add_argument("--world", type=int, default=2, help="the ranks' world (sizes the data)")
    p.add_argument("--cpu-as-cuda", dest="cpu_as_cuda", action="store_true")
    return p


def gathered_state(module, stage: int) -> dict:
    """The module's full state dict as lists (gathered from the shards under stage 3)."""
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            return {k: v.detach().clone().tolist() for k, v in module.state_dict().items()}
    return {k: v.detach().clone().tolist() for k, v in module.state_dict().items()}


def cpu_as_cuda(base: type):
    class CPUAsCUDA(base):
        def setup_device(self, device):
            pass

        def teardown(self):
            pass

        def get_device_stats(self, device):
            return {}

        @staticmethod
        def parse_devices(devices):
            return list(range(int(devices)))

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("cpu", i) for i in devices]

        @staticmethod
        def is_available():
            return True

    return CPUAsCUDA()
