"""zerolite.checkpointing (DeepSpeed's deepspeed.checkpointing): a GPT whose blocks run under
activation checkpointing trains like the single-process reference at stage 3, the recompute
in backward re-gathers the released blocks, and nothing stays gathered after a step."""
import json

import pytest
import torch
import torch.utils.checkpoint

import zerolite
import zerolite.checkpointing as checkpointing
from zerolite.models import GPT
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import rank_micro_batches, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, TINY, adamw, batches, ds_config


class CheckpointedGPT(GPT):
    """The tiny GPT with each block's forward under zerolite.checkpointing.checkpoint."""

    checkpoint_fn = staticmethod(checkpointing.checkpoint)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = self.checkpoint_fn(block, x)
        logits = self.lm_head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                 targets.reshape(-1))


class TorchCheckpointedGPT(CheckpointedGPT):
    checkpoint_fn = staticmethod(
        lambda fn, *a: torch.utils.checkpoint.checkpoint(fn, *a, use_reentrant=False))


def _model(cls=CheckpointedGPT):
    torch.manual_seed(0)
    return cls(TINY)


def _train(rank, world, stage):
    recomputes = []

    model = _model()
    for block in model.blocks:  # count forwards that run inside backward (the recomputes)
        block.register_forward_pre_hook(
            lambda m, a: recomputes.append(torch.is_grad_enabled() and engine.sharded.in_backward))
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=stage))
    gas = engine.gradient_accumulation_steps()
    losses, left_gathered = [], []
    for batch in batches():
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, gas):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
            left_gathered.append(engine.sharded.gathered_nbytes())
        torch.distributed.all_reduce(total)
        losses.append(total.item() / (world * gas))
    return losses, gather_full_state_dict(engine.sharded), left_gathered, sum(recomputes)


@pytest.mark.parametrize("stage", [3, 2])
def test_checkpointed_blocks_match_reference(stage):
    world = 2
    # References: plain torch checkpointing and no checkpointing at all (the same numbers).
    ref_losses, ref_params = train_reference(_model(TorchCheckpointedGPT), batches(), adamw,
                                             clip=CLIP)
    plain_losses, _ = train_reference(_model(GPT), batches(), adamw, clip=CLIP)
    torch.testing.assert_close(torch.tensor(plain_losses), torch.tensor(ref_losses), rtol=1e-6,
                               atol=0)
    losses, params, left, recomputes = run_ranks(_train, world, stage)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-5, msg=name)
    micro_steps = len(batches()) * 2
    assert recomputes == micro_steps * TINY.n_layer, "each block recomputed once per backward"
    if stage == 3:
        assert max(left) == 0, "a unit stayed gathered after a step"


def test_configure_accepts_deepspeed_settings(tmp_path, caplog):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"activation_checkpointing": {
        "partition_activations": True, "cpu_checkpointing": False,
        "contiguous_memory_optimization": False, "number_checkpoints": 4,
        "synchronize_checkpoint_boundary": False, "profile": False}}))
    checkpointing.reset()
    assert not checkpointing.is_configured()
    with caplog.at_level("INFO", logger="zerolite"):
        checkpointing.configure(None, deepspeed_config=str(cfg), profile=True)
    assert checkpointing.is_configured()
    assert "partition_activations" in caplog.text and "profile" in caplog.text
    checkpointing.model_parallel_cuda_manual_seed(123)
    a = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(a, torch.rand(3))
    checkpointing.reset()
    assert not checkpointing.is_configured()
    # Works on plain modules too, with gradients to the parameters.
    lin = torch.nn.Linear(4, 4)
    out = checkpointing.checkpoint(lin, torch.randn(2, 4))
    out.sum().backward()
    assert lin.weight.grad is not None


def _peak_live(rank, world):
    from zerolite.models import GPTConfig

    torch.manual_seed(0)
    model = CheckpointedGPT(GPTConfig(vocab_size=256, seq_len=16, n_layer=4, n_head=2,
                                      d_model=32))
    cfg = ds_config(world, stage=3)
    cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    engine, *_ = zerolite.initialize(model=model, config=cfg)
    for x, y in rank_micro_batches(batches()[0], rank, world, 2):
        engine.backward(engine(x, y))
        engine.step()
    res = engine.sharded.residency
    return res.peak_live_numel, res.numels


def test_recomputed_units_are_released_during_backward():
    peak, numels = run_ranks(_peak_live, 2)[0]
    # root + the unit in backward + the next one, whose gather starts as the previous unit's
    # input grad (= this unit's output grad) arrives: never the four blocks at once
    assert peak <= numels[0] + 2 * max(numels[1:]) < sum(numels)
