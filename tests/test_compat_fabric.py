"""Acceptance: a Lightning Fabric loop with Fabric's own DeepSpeedStrategy (stages 2 and 3),
unchanged, on zerolite as DeepSpeed (world 2, CPU/gloo): compat_scripts/fabric_tiny.py.

Fabric steps the optimizer deepspeed.initialize returned (`optimizer.step()`, never
`engine.step()`), so this is the test that stepping it is the whole ZeRO update (clipping
included), as DeepSpeed's ZeRO optimizer; it finds the engine among `module.modules()`, so
the engine is an nn.Module; and `fabric.save` / `fabric.load` go through save_checkpoint's
client_state (a tensor that differs per rank: each rank's own under stage 3, rank 0's under
stage 2, as DeepSpeed). Losses (mean of the ranks) and final weights match one plain Fabric
process on the same global batches, and the saved-and-loaded run ends exactly where the
straight one ends."""
import pytest
import torch

from client_runs import as_tensors, reference_and_gpu_run, run_client

pytest.importorskip("lightning")
SCRIPT = "fabric_tiny.py"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    (ref,) = run_client(SCRIPT, tmp_path_factory.mktemp("fabric") / "ref", "--world", "2")
    assert ref["resumed"]["losses"] == ref["losses"]  # the plain run resumes exactly too
    return ref


@pytest.mark.parametrize("stage", [2, 3])
def test_fabric_deepspeed_strategy_matches_single_process(reference, tmp_path, stage):
    ranks = run_client(SCRIPT, tmp_path / "ds", "--stage", str(stage), "--cpu-as-cuda", ranks=2)
    losses = torch.tensor(reference["losses"])
    mean = torch.tensor([r["losses"] for r in ranks]).mean(dim=0)
    torch.testing.assert_close(mean, losses, rtol=1e-5, atol=1e-6)
    for rank, r in enumerate(ranks):
        assert r["engine"] == "ZeroEngine" and "zerolite" in r["deepspeed"]
        torch.testing.assert_close(as_tensors(r["state"]), as_tensors(reference["state"]), rtol=0,
                                   atol=1e-6)
        assert r["resumed"]["losses"] == r["losses"] and r["resumed"]["state"] == r["state"]
        assert r["resumed"]["step"] == 4
        # Its own tensor back under stage 3; rank 0's (so not rank 1's own) under stage 2.
        assert r["resumed"]["mine_back"] == (stage == 3 or rank == 0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fabric_deepspeed_strategy_on_gpu(tmp_path):
    ref, rank = reference_and_gpu_run(SCRIPT, tmp_path)
    torch.testing.assert_close(torch.tensor(rank["losses"]), torch.tensor(ref["losses"]),
                               rtol=1e-4, atol=1e-5)  # the reference runs on the CPU
    assert rank["resumed"]["losses"] == rank["losses"] and rank["resumed"]["mine_back"]
