"""`zero.Init`: partition parameters while the model is being built (DeepSpeed's zero.Init).

The user-facing context over two layers below it: module_patching.py (the global patching
of module construction, weight initialisation and `Module.apply` while a context is active)
and sliced_param.py (how one parameter is split, gathered and released, and what it carries).
Each parameter is broadcast from rank 0 (so all ranks agree) when its module is built, and
only this rank's slice of it is kept.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist
import torch.nn as nn

from zerolite.device import default_device
from zerolite.errors import ZeroliteConfigError
from zerolite.zero import module_patching
from zerolite.zero.sliced_param import is_partitioned, partition_param

logger = logging.getLogger("zerolite")


class Init:
    """Partition parameters as modules are constructed (DeepSpeed's `deepspeed.zero.Init`).

        with zerolite.zero.Init():
            model = MyModel()          # never fully materialised on one rank
        engine, *_ = zerolite.initialize(model=model, config=cfg)

    `module`: an already-built module to partition now. `data_parallel_group`: only the
    default (world) group is supported, since the engine shards over the world.
    `config_dict_or_path` / `config`, `remote_device`, `pin_memory`: accepted and ignored
    (logged). `dtype`: store the slices in this dtype; by default they keep the parameters'
    dtype so the engine builds fp32 masters from the original values (DESIGN: numerics).
    `enabled=False` makes the context a no-op. Nested contexts act as one. A module built on
    the meta device (`device="meta"`, `torch.nn.utils.skip_init`) is partitioned when
    `to_empty` materialises it inside the context; the values are rank 0's (uninitialised
    memory, as after to_empty anywhere) until the user loads or initialises them.

    After the context: `peak_param_bytes` is the most parameter memory that was alive at the
    end of any module's `__init__` (every slice kept so far plus the module's full params
    about to be partitioned); `partitioned_bytes` the slices kept.
    """

    def __init__(self, module: nn.Module | None = None, data_parallel_group=None,
                 mem_efficient_linear: bool = True, remote_device=None, pin_memory: bool = False,
                 config_dict_or_path=None, config=None, enabled: bool = True,
                 dtype: torch.dtype | None = None, mpu=None, **kwargs):
        self.enabled = enabled
        self.dtype = dtype
        self.partitioned_bytes = 0
        self.peak_param_bytes = 0
        self.num_partitioned = 0
        self._depth: dict[int, int] = {}
        self.device = default_device()
        """Where the slices go: the engine's device (cuda:LOCAL_RANK or cpu), as DeepSpeed."""
        if not enabled:
            return
        if mpu is not None:
            raise ZeroliteConfigError("zero.Init(mpu=...): model parallelism is not supported")
        ignored = {k: v for k, v in dict(remote_device=remote_device, pin_memory=pin_memory,
                                         config_dict_or_path=config_dict_or_path, config=config,
                                         **kwargs).items() if v not in (None, False)}
        if remote_device in ("cpu", "nvme"):
            logger.warning("zero.Init(remote_device=%r): offload is not supported; parameter "
                           "slices go to the engine's device (%s)", remote_device, self.device)
        if ignored:
            logger.debug("zero.Init: ignoring %s", sorted(ignored))
        if not dist.is_initialized():
            from zerolite.comm import init_distributed
            init_distributed()
        if data_parallel_group is not None and \
                dist.get_world_size(data_parallel_group) != dist.get_world_size():
            raise ZeroliteConfigError(
                "zero.Init(data_parallel_group=...): zerolite shards over the whole world "
                f"({dist.get_world_size()} ranks); a group of "
                f"{dist.get_world_size(data_parallel_group)} ranks is not supported")
        if module is not None:
            self._partition_module(module)

    def __enter__(self):
        if not self.enabled:
            return self
        module_patching.activate(self)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        module_patching.deactivate(self)
        logger.debug("zero.Init: partitioned %d parameters, %.1f MiB kept on this rank",
                     self.num_partitioned, self.partitioned_bytes / 2**20)
        return False

    def _partition_module(self, module: nn.Module) -> None:
        # Meta parameters hold nothing: they are partitioned when `to_empty` gives them
        # storage (module_patching.py), as DeepSpeed does for torch.nn.utils.skip_init.
        todo = [p for p in module.parameters() if not is_partitioned(p)
                and not hasattr(p, "zl_handle") and not p.is_meta]
        if not todo:
            return
        pending = sum(p.untyped_storage().nbytes() for p in
                      {p.untyped_storage().data_ptr(): p for p in todo}.values())
        self.peak_param_bytes = max(self.peak_param_bytes, self.partitioned_bytes + pending)
        for p in todo:
            self.partitioned_bytes += partition_param(p, self.dtype, ds_id=self.num_partitioned,
                                                      device=self.device)
            self.num_partitioned += 1
