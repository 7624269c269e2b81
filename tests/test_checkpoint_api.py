"""DeepSpeed's checkpoint-call semantics: save_checkpoint("") / save_checkpoint(None) raise
ValueError and write nothing (DeepSpeed 0.19's check), checkpoint.tag_validation (Warn, the
default / Ignore / Fail) when ranks pass different tags, and engine.empty_partition_cache()."""
import logging
import os

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine

from gpt_cases import batches, ds_config, tiny_gpt


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _save_with_rank_tags(rank, world, ckpt, mode):
    cfg = ds_config(world, stage=3)
    if mode is not None:
        cfg["checkpoint"] = {"tag_validation": mode}
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=cfg)
    train_engine(engine, batches(1), rank, world)
    seen = _Lines()
    logging.getLogger("zerolite").addHandler(seen)
    try:
        engine.save_checkpoint(ckpt, tag=f"rank{rank}")
        outcome = "saved"
    except AssertionError as e:
        outcome = f"AssertionError: {e}"
    warned = [m for m in seen.lines if "not consistent across all ranks" in m]
    if outcome == "saved":  # the checkpoint is whole: it loads at once
        path, _ = engine.load_checkpoint(ckpt)
        outcome = f"saved {os.path.basename(os.path.dirname(path))}"
    return outcome, warned


@pytest.mark.parametrize("mode", [None, "Warn", "ignore", "FAIL"])
def test_tag_validation(tmp_path, mode):
    results = run_ranks(_save_with_rank_tags, 2, str(tmp_path), mode)
    if mode == "FAIL":
        for outcome, _ in results:
            assert outcome.startswith("AssertionError") and "'Fail'" in outcome, outcome
            assert "not consistent" in outcome
        assert not os.path.exists(tmp_path / "rank0") and not os.path.exists(tmp_path / "latest")
        return
    assert [r[0] for r in results] == ["saved rank0", "saved rank0"]
    assert not os.path.exists(tmp_path / "rank1")
    warned = [r[1] for r in results]
    if mode == "ignore":
        assert warned == [[], []]
    else:  # Warn is the default, as in DeepSpeed
        assert all(len(w) == 1 and "rank 0's tag 'rank0'" in w[0] for w in warned), warned


def _empty_save_dir(rank, world, where):
    os.chdir(where)
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=2))
    errors = []
    for bad in ("", None):
        try:
            engine.save_checkpoint(bad)
        except ValueError as e:
            errors.append(str(e))
    return errors, sorted(os.listdir(where))


def test_save_checkpoint_needs_a_directory(tmp_path):
    errors, listing = run_ranks(_empty_save_dir, 2, str(tmp_path))[0]
    assert errors == ["save_dir must be a non-empty string, got ''",
                      "save_dir must be a non-empty string, got None"]
    assert listing == []  # nothing written into the working directory


def _train_with_cache_emptied(rank, world, empty):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(
        world, stage=3, zero_optimization={"stage": 3}))  # DeepSpeed's reuse defaults: a cache
    losses, held = [], []
    for batch in batches(4):
        losses += train_engine(engine, [batch], rank, world)
        before = engine.memory_stats()
        if empty:
            engine.empty_partition_cache()
        after = engine.memory_stats()
        held.append((before["buffer_pool"], after["buffer_pool"], after["gathered"]))
    return losses, held


def test_empty_partition_cache_frees_and_training_goes_on():
    plain = run_ranks(_train_with_cache_emptied, 2, False)
    emptied = run_ranks(_train_with_cache_emptied, 2, True)
    for (losses, held), (ref_losses, ref_held) in zip(emptied, plain):
        assert losses == ref_losses  # bitwise: the buffers are refilled from the same shards
        assert all(before > 0 for before, _, _ in ref_held)
        assert all(after == 0 for _, after, _ in held), held
        assert held[-1][2] <= ref_held[-1][2]
    assert torch.tensor([h[0] for h in emptied[0][1]]).gt(0).all()
