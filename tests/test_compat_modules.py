"""The forwarding modules on their own: deepspeed.accelerator over the CPU, deepspeed.comm at
world 2, deepspeed.utils.zero_to_fp32 over a real zerolite checkpoint, clone_tensors_for_torch_save."""
import os

import torch

import zerolite
from zerolite.compat.deepspeed import accelerator as ds_accelerator
from zerolite.compat.deepspeed.checkpoint.utils import clone_tensors_for_torch_save
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import batches, ds_config, tiny_gpt


def test_cpu_accelerator_answers_what_scripts_ask():
    acc = ds_accelerator.ZeroliteAccelerator("cpu")
    assert acc.device_name() == acc.device_name(1) == acc.current_device_name() == "cpu"
    assert acc.communication_backend_name() == "gloo" and acc.is_available()
    assert acc.is_bf16_supported() and not acc.is_fp16_supported()
    assert acc.on_accelerator(torch.zeros(1)) and acc.device(0) == torch.device("cpu")
    acc.synchronize(), acc.empty_cache(), acc.set_device(0)  # no-ops on CPU, must not raise
    acc.manual_seed(5)
    a = torch.rand(3)
    acc.manual_seed(5)
    assert torch.equal(a, torch.rand(3))
    assert acc.memory_allocated() > 0 and acc.total_memory() >= acc.memory_allocated()
    cuda = ds_accelerator.ZeroliteAccelerator("cuda")
    assert (cuda.device_name(3), cuda.communication_backend_name()) == ("cuda:3", "nccl")
    assert ds_accelerator.get_accelerator() is ds_accelerator.get_accelerator()


def _comm(rank, world):
    from zerolite.compat.deepspeed import comm as dist
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)  # torch.distributed's own, through the module __getattr__
    full = torch.arange(4.0) * (rank + 1)
    out = torch.empty(2)
    dist.reduce_scatter_fn(out, full)
    gathered = torch.empty(2 * world)
    dist.allgather_fn(gathered, torch.full((2,), float(rank)))
    dist.barrier()
    return (dist.get_rank(), dist.get_world_size(), dist.get_local_rank(), dist.is_initialized(),
            x.item(), out.tolist(), gathered.tolist(), dist.ReduceOp.SUM == torch.distributed.ReduceOp.SUM)


def test_comm_is_torch_distributed_with_deepspeed_names():
    for rank, r in enumerate(run_ranks(_comm, 2)):
        assert r[:4] == (rank, 2, rank, True)
        assert r[4] == 3.0
        assert r[5] == [x * 3 for x in (2 * rank, 2 * rank + 1)]  # sum of (arange * 1, * 2)
        assert r[6] == [0.0, 0.0, 1.0, 1.0] and r[7]


def _train_and_save(rank, world, save_dir):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=3))
    train_engine(engine, batches(3), rank, world)
    engine.save_checkpoint(save_dir)
    return gather_full_state_dict(engine.sharded)


def test_zero_to_fp32_functions_over_zerolite_checkpoints(tmp_path):
    from zerolite.compat.deepspeed.utils import zero_to_fp32

    trained = run_ranks(_train_and_save, 2, str(tmp_path / "ckpt"))[0]
    sd = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "ckpt"))
    params = {k: v for k, v in sd.items() if k in trained}
    assert set(params) == set(trained)
    for k, v in trained.items():
        torch.testing.assert_close(params[k], v, rtol=0, atol=0, msg=k)
    files = zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(
        str(tmp_path / "ckpt"), str(tmp_path / "st"), safe_serialization=True)
    from safetensors.torch import load_file
    st = load_file(os.path.join(tmp_path / "st", files[0]))
    bin_files = zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(
        str(tmp_path / "ckpt"), str(tmp_path / "bin"))
    assert bin_files == ["pytorch_model.bin"]
    binary = torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)
    fresh = zero_to_fp32.load_state_dict_from_zero_checkpoint(tiny_gpt(seed=7),
                                                             str(tmp_path / "ckpt"))
    for k, v in trained.items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0, msg=k)
        torch.testing.assert_close(binary[k], v, rtol=0, atol=0, msg=k)
        if k in st:  # safetensors stores a tied weight once
            torch.testing.assert_close(st[k], v, rtol=0, atol=0, msg=k)


def test_clone_tensors_for_torch_save_detaches_views():
    base = torch.arange(10.0, requires_grad=True)
    item = {"a": base[:2], "b": [base[2:4], (base[4:5],)], "n": 3}
    out = clone_tensors_for_torch_save(item)
    assert out["n"] == 3 and isinstance(out["b"][1], tuple)
    assert out["a"].untyped_storage().nbytes() == 2 * 4 and not out["a"].requires_grad
    assert torch.equal(out["b"][0], base[2:4].detach())
