"""The CUDA path, end to end (skipped without CUDA; `make gpu-check` runs it on a GPU):
placement, stage-3 parity against single-process PyTorch on the same GPU (fp32, and bf16
against the bf16-params + fp32-masters reference), compiled kernels
inside training, and checkpoints of CUDA-trained shards. One GPU runs world 1 on NCCL and
2 ranks sharing the GPU on gloo (harness_mode)."""
import copy

import pytest
import torch

import zerolite
from zerolite.checkpoint import consolidate_checkpoint, get_fp32_state_dict
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from zerolite.testing.bf16_reference import train_bf16_master_reference

from gpt_cases import CLIP, GAS, adamw, batches, ds_config, tiny_gpt

pytestmark = pytest.mark.cuda


def _cpu(state):
    return {k: v.detach().cpu() for k, v in state.items()}


def _reference_on_cuda():
    model = copy.deepcopy(tiny_gpt()).to("cuda:0")
    losses, state = train_reference(model, batches(), adamw, clip=CLIP)
    return losses, _cpu(state)


def _train(rank, world, extra, save_dir=None):
    model = tiny_gpt()  # built on CPU, as tutorials do: initialize moves it
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=ds_config(world, **extra))
    placed = {str(engine.device), *{str(p.device) for p in model.parameters()},
              *{str(t.device) for f in engine.sharded.flats for t in (f.shard, f.master)
                if t is not None}}
    losses = train_engine(engine, batches(), rank, world)
    if save_dir:
        engine.save_checkpoint(save_dir, tag="t")
    return losses, _cpu(gather_full_state_dict(engine.sharded)), placed, str(
        torch.distributed.get_backend())


@pytest.mark.parametrize("world", [1, 2])
def test_stage3_on_cuda_matches_single_process(world):
    ref_losses, ref_params = _reference_on_cuda()
    losses, params, placed, backend = run_ranks(_train, world, {}, timeout_s=600)[0]
    assert placed == {"cuda:0"}, placed
    assert ("nccl" in backend) if world == 1 else backend == "gloo"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-5, msg=name)


def _train_bf16(rank, world):
    model = tiny_gpt()
    cfg = ds_config(world, bf16=True)
    cfg["optimizer"]["params"]["torch_adam"] = True  # the reference's kernel (see test_bf16_reference)
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses = train_engine(engine, batches(), rank, world)
    return losses, _cpu(gather_full_state_dict(engine.sharded))


@pytest.mark.parametrize("world", [1, 2])
def test_stage3_bf16_on_cuda_matches_bf16_master_reference(world):
    """bf16 params + fp32 masters on the GPU, against the plain-torch reference of that
    algorithm on the same GPU with the same micro-batch shapes. Below one bf16 ulp (~4e-3
    relative): a gradient summed at another precision or a truncating re-cast moves weights by a
    whole ulp."""
    model = tiny_gpt().to("cuda:0")
    ref_losses, ref_state = train_bf16_master_reference(
        model, batches(), lambda m, x, y: m(x.to("cuda:0"), y.to("cuda:0")), adamw, clip=CLIP,
        world=world, gas=GAS)
    losses, params = run_ranks(_train_bf16, world, timeout_s=600)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=0)
    for name, value in _cpu(ref_state).items():
        torch.testing.assert_close(params[name], value, rtol=1e-3, atol=1e-5, msg=name)


def test_quantized_training_on_cuda_uses_compiled_kernels():
    # int8 gradients + int8 weights on the GPU (2 ranks: at world 1 nothing is quantized):
    # trains like the exact run within 2%.
    from triton_kernels import dispatch

    assert dispatch.use_triton(torch.zeros(1, device="cuda:0"))
    exact, *_ = run_ranks(_train, 2, {}, timeout_s=600)[0]
    quant = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                   "stage3_max_reuse_distance": 0,
                                   "zero_quantized_gradients": True,
                                   "zero_quantized_weights": True}}
    q_losses, *_ = run_ranks(_train, 2, quant, timeout_s=600)[0]
    assert abs(q_losses[-1] - exact[-1]) <= 0.02 * exact[-1], (q_losses[-1], exact[-1])


def test_checkpoint_of_cuda_shards(tmp_path):
    losses, params, *_ = run_ranks(_train, 2, {}, str(tmp_path), timeout_s=600)[0]
    loaded = get_fp32_state_dict(str(tmp_path), tag="t")
    for name, value in params.items():
        assert torch.equal(loaded[name], value), name
    out = tmp_path / "out"
    consolidate_checkpoint(str(tmp_path), out, tag="t")
    from safetensors.torch import load_file

    model = tiny_gpt()
    model.load_state_dict(load_file(out / "model.safetensors"), strict=True)


def _consolidate_peak(rank, world):
    # 16 units of 4 MiB: a clone of the model on the GPU (64 MiB) cannot pass the bound below
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(16)])
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world))
    largest = max(f.padded_numel * f.shard.element_size() for f in engine.sharded.flats)
    model_bytes = sum(f.padded_numel * f.shard.element_size() for f in engine.sharded.flats)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    sd = engine._zero3_consolidated_16bit_state_dict()
    peak = torch.cuda.max_memory_allocated() - base
    return {str(v.device) for v in sd.values()}, peak, largest, model_bytes


def test_consolidated_16bit_state_dict_streams_to_cpu():
    devices, peak, largest, model_bytes = run_ranks(_consolidate_peak, 1, timeout_s=300)[0]
    assert devices == {"cpu"}
    assert model_bytes >= 4 * (2 * largest + (1 << 21))  # the bound below can fail
    # one gathered flat at a time (plus allocator rounding), not a copy of the whole model
    assert peak <= 2 * largest + (1 << 21), (peak, largest, model_bytes)


def _init_on_cuda(rank, world):
    with zerolite.zero.Init():
        model = tiny_gpt()  # modules are built on the CPU; their slices go to the GPU
    return {str(p.zl_partitioned.local.device) for p in model.parameters()}


def test_zero_init_partitions_onto_the_gpu():
    assert run_ranks(_init_on_cuda, 2, timeout_s=300)[0] == {"cuda:0"}
