"""Acceptance: a PyTorch Lightning program with Lightning's own DeepSpeedStrategy (stages 2
and 3, and stage 3 with the model built in `configure_model` under zero.Init), unchanged, on
zerolite as DeepSpeed (world 2, CPU/gloo): compat_scripts/lightning_tiny.py.

Its per-micro-batch losses (the mean over the two ranks) and final weights match the same
program on one process with the same global batches; the learning rates Lightning's scheduler
sets through the engine's optimizer match; and stopping after an epoch, saving through
`trainer.save_checkpoint` (Lightning's checkpoint dict, with tensors, as DeepSpeed's
client_state) and resuming in a new Trainer ends exactly where the uninterrupted run ends.
Under stage 3 each rank gets its own client_state back (ModelCheckpoint's score is per rank),
under stage 2 every rank gets rank 0's, as DeepSpeed.

On CPU the script hands Lightning a CUDAAccelerator that places on CPU (Lightning refuses
DeepSpeed on any other accelerator; see the script's note); the cuda test runs it on the GPU
as users do."""
import pytest
import torch

from client_runs import as_tensors, reference_and_gpu_run, run_client

pytest.importorskip("lightning")
SCRIPT = "lightning_tiny.py"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_client(SCRIPT, tmp_path_factory.mktemp("lightning") / "ref", "--world", "2")[0]


def _check_against(ref, ranks, world, atol=1e-6):
    losses = torch.tensor(ref["losses"])
    assert len(losses) == 24 and losses[12:].mean() < losses[:12].mean() - 0.05  # it learns
    mean = torch.tensor([r["losses"] for r in ranks]).mean(dim=0)
    torch.testing.assert_close(mean, losses, rtol=1e-5, atol=1e-6)
    for r in ranks:
        assert r["world"] == world and r["global_step"] == ref["global_step"] == 12
        assert r["lrs"] == pytest.approx(ref["lrs"], rel=1e-12)
        torch.testing.assert_close(as_tensors(r["state"]), as_tensors(ref["state"]), rtol=0,
                                   atol=atol)
        # The resumed run is the uninterrupted one, bit for bit.
        assert r["resumed"]["losses"] == r["losses"] and r["resumed"]["lrs"] == r["lrs"]
        assert r["resumed"]["state"] == r["state"]
        assert r["resumed"]["global_step"] == 12


@pytest.mark.parametrize("stage, build", [
    (2, []), (3, []), (3, ["--configure-model"]),
    (3, ["--strategy", "deepspeed_stage_3_offload"]),  # offload_optimizer and offload_param cpu
], ids=["stage2", "stage3", "stage3-zero.Init", "stage3-offload"])
def test_lightning_deepspeed_strategy_matches_single_process(reference, tmp_path, stage, build):
    ranks = run_client(SCRIPT, tmp_path / "ds", "--stage", str(stage), "--cpu-as-cuda", *build,
                       ranks=2)
    for r in ranks:
        assert r["engine"] == "ZeroEngine" and "zerolite" in r["deepspeed"]
        assert r["partitioned_at_build"] == ("--configure-model" in build)
        assert r["offload"] == [bool(build) and "offload" in build[-1]] * 2
    _check_against(reference, ranks, world=2)
    scores = [r["resumed"]["best_model_score"] for r in ranks]
    # Each rank monitors its own train_loss: its own score comes back under stage 3.
    assert (scores[0] != scores[1]) == (stage == 3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lightning_deepspeed_strategy_on_gpu(tmp_path):
    ref, rank = reference_and_gpu_run(SCRIPT, tmp_path)
    _check_against(ref, [rank], world=1, atol=1e-5)  # the reference runs on the CPU


def _bf16_reference(world=2):
    """Lightning's bf16-mixed on DeepSpeed as plain torch (zerolite/testing/bf16_reference.py):
    inputs and targets cast to bf16 (DeepSpeedPrecision.convert_input), the loss in bf16 and
    divided by accumulate_grad_batches (Lightning) and by gradient_accumulation_steps again
    (engine.backward), fp32 masters under AdamW + the per-step LambdaLR, clipping 0.5. Each
    optimizer step's global batch is the ranks' micro-batches (the DistributedSampler Lightning
    gives each rank: shuffled with seed 0, set_epoch every epoch), one piece each."""
    import importlib.util
    import os
    import sys

    import torch.nn.functional as F

    from client_runs import SCRIPTS
    from zerolite.testing.bf16_reference import train_bf16_master_reference

    sys.path.insert(0, SCRIPTS)
    spec = importlib.util.spec_from_file_location("lightning_tiny",
                                                  os.path.join(SCRIPTS, SCRIPT))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    data = m.loader(world, reference=False).dataset
    batches = []
    for epoch in range(2):
        ranks = []
        for rank in range(world):
            sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank,
                                                          shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            ranks.append(list(sampler))
        per_rank = len(ranks[0])
        for start in range(0, per_rank, m.MICRO * m.GAS):
            rows = [i for idx in ranks for i in idx[start:start + m.MICRO * m.GAS]]
            x, y = data[rows]
            batches.append((x, y))
    torch.manual_seed(0)
    model = m.Regressor()

    def loss_fn(work, x, y):
        return F.mse_loss(work(x.bfloat16()), y.bfloat16()) / m.GAS

    losses, state = train_bf16_master_reference(
        model, batches, loss_fn,
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01), clip=m.CLIP,
        world=world, gas=m.GAS, stage=3,
        make_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s)))
    return torch.tensor(losses) * m.GAS, state  # the losses as Lightning records them


@pytest.mark.slow
def test_lightning_bf16_mixed_matches_the_bf16_master_reference(tmp_path):
    """precision="bf16-mixed": the engine trains bf16 parameters from fp32 masters exactly as
    the plain-torch bf16 + fp32-masters reference does, step for step, and resumes bit for
    bit."""
    ref_losses, ref_state = _bf16_reference()
    ranks = run_client(SCRIPT, tmp_path / "ds", "--stage", "3", "--cpu-as-cuda",
                       "--precision", "bf16-mixed", ranks=2)
    assert ref_losses[6:].mean() < ref_losses[:6].mean() - 0.05  # it learns
    micro = torch.tensor([r["losses"] for r in ranks], dtype=torch.float64)  # rank x micro
    steps = micro.view(2, 12, 2).mean(dim=(0, 2))
    torch.testing.assert_close(steps, ref_losses.double(), rtol=1e-6, atol=0)
    for r in ranks:
        assert r["dtype"] == "torch.bfloat16" and r["global_step"] == 12
        for name, master in ref_state.items():
            got = torch.tensor(r["state"][name], dtype=torch.bfloat16)
            torch.testing.assert_close(got, master.bfloat16(), rtol=0, atol=0, msg=name)
        assert r["resumed"]["losses"] == r["losses"] and r["resumed"]["state"] == r["state"]
