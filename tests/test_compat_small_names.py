"""The small DeepSpeed names the inventory marks done: deepspeed.utils' logging, module and
data-parallel helpers and RepeatingLoader, deepspeed.comm's capability probes, the
accelerator base class, and the top-level aliases (dist, logger, load_ds_config, ...)."""
import logging

import pytest
import torch

from zerolite.compat import deepspeed
from zerolite.compat.deepspeed import accelerator, comm, utils
from zerolite.testing.multiprocess import run_ranks


def test_logging_helpers(caplog):
    with caplog.at_level(logging.INFO, logger="zerolite"):
        for _ in range(3):
            utils.log_dist_once("only once, please", ranks=[0])
    assert sum("only once, please" in r.getMessage() for r in caplog.records) == 1
    mine = logging.getLogger("zerolite.test_small_names")
    mine.addHandler(logging.NullHandler())
    utils.set_log_level_from_string("warning", custom_logger=mine)
    assert mine.level == logging.WARNING and mine.handlers[0].level == logging.WARNING
    with pytest.raises(ValueError, match="loud"):
        utils.set_log_level_from_string("loud")
    assert deepspeed.logger is utils.logger and deepspeed.log_dist is utils.log_dist


def test_module_helpers_and_repeating_loader():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    assert utils.recursive_getattr(net, "1.0") is net[1][0]
    utils.recursive_setattr(net, "1.0", torch.nn.Tanh())
    assert isinstance(net[1][0], torch.nn.Tanh)
    loader = utils.RepeatingLoader([1, 2, 3])
    assert [next(loader) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    assert iter(loader) is loader


def test_compression_helper_shim_warns_and_gives_the_module_helpers():
    """DeepSpeed 0.19 keeps deepspeed.compression.helper only for DeepSpeed-Chat's imports."""
    import importlib
    import sys

    sys.modules.pop("zerolite.compat.deepspeed.compression.helper", None)
    with pytest.warns(FutureWarning, match="deprecated"):
        helper = importlib.import_module("zerolite.compat.deepspeed.compression.helper")
    assert helper.recursive_getattr is utils.recursive_getattr
    assert helper.recursive_setattr is utils.recursive_setattr


def _groups(rank, world):
    pair = torch.distributed.new_group([1, 0])
    out = (utils.get_data_parallel_world_size(), utils.get_data_parallel_rank(),
           utils.get_data_parallel_group() is torch.distributed.group.WORLD,
           utils.get_model_parallel_world_size(), utils.get_tensor_model_parallel_rank(),
           comm.get_all_ranks_from_group(), sorted(comm.get_all_ranks_from_group(pair)))
    torch.distributed.barrier()  # rank 0 hosts the store: it leaves last
    return out


def test_data_parallel_helpers_at_world_2():
    for rank, got in enumerate(run_ranks(_groups, 2)):
        assert got == (2, rank, True, 1, 0, [0, 1], [0, 1])


def test_comm_probes_accelerator_and_top_level():
    assert comm.has_all_gather_into_tensor() and comm.has_reduce_scatter_tensor()
    assert comm.has_all_reduce_coalesced() and comm.has_coalescing_manager()
    assert isinstance(accelerator.get_accelerator(), accelerator.DeepSpeedAccelerator)
    assert deepspeed.dist is comm and deepspeed.TORCH_DISTRIBUTED_DEFAULT_PORT == 29500
    assert deepspeed.MUON_OPTIMIZER == "muon"
    assert deepspeed.load_ds_config({"train_batch_size": 2}) == {"train_batch_size": 2}
    with pytest.raises(ValueError, match="file not found"):
        deepspeed.load_ds_config("no/such/ds_config.json")
