"""Checkpoints: exact resume, resharding N->M, crash safety, consolidation, bad input."""
import functools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import zerolite
from zerolite.checkpoint import (consolidate_checkpoint,
                                 get_fp32_state_dict, load_state_dict_from_checkpoint)
from zerolite.errors import ZeroliteError
from zerolite.models import GPT, GPTConfig
from zerolite.testing.multiprocess import RankFailed, run_ranks
from zerolite.testing.reference import make_token_batches, train_engine, train_reference
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import CLIP, TINY, adamw, ds_config, tiny_gpt

# Global batch 12 with no accumulation divides by 1, 2, 3 and 4 ranks, so every world size in
# the resharding matrix trains on exactly the same global batches as the reference.
GB, STEPS, HALF = 12, 20, 10


def _batches():
    return make_token_batches(STEPS, GB, TINY.seq_len, TINY.vocab_size, seed=1)


def _cfg(world, **extra):
    return ds_config(world, gas=1, train_batch_size=GB, **extra)


def _engine(world, model=None, **extra):
    model = model or tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                     config=_cfg(world, **extra))
    return engine


@functools.lru_cache(maxsize=None)
def _reference():
    return train_reference(tiny_gpt(), _batches(), adamw, clip=CLIP)


# -- rank functions -----------------------------------------------------------------------
def _train_and_save(rank, world, save_dir, tags=("a",)):
    engine = _engine(world)
    losses = train_engine(engine, _batches()[:HALF], rank, world)
    for tag in tags:
        engine.save_checkpoint(save_dir, tag=tag, client_state={"epoch": 3, "note": [tag]})
    return losses, gather_full_state_dict(engine.sharded), torch.rand(4)


def _load_and_train(rank, world, save_dir):
    engine = _engine(world)
    path, client = engine.load_checkpoint(save_dir)
    rng_after = torch.rand(4)
    assert engine.global_steps == HALF and engine.global_samples == HALF * GB
    losses = train_engine(engine, _batches()[HALF:], rank, world)
    return path, client, losses, gather_full_state_dict(engine.sharded), rng_after


def _train_straight(rank, world):
    engine = _engine(world)
    return train_engine(engine, _batches(), rank, world), gather_full_state_dict(engine.sharded)


@pytest.fixture(scope="module")
def ckpt2(tmp_path_factory):
    """A world-2 checkpoint after 10 steps (tags 'b' then 'a'; latest = 'a')."""
    d = str(tmp_path_factory.mktemp("ckpt2"))
    losses, params, rng = run_ranks(_train_and_save, 2, d, ("b", "a"))[0]
    return d, losses, params, rng


# -- exact resume and resharding ----------------------------------------------------------
def test_exact_resume_bitwise(ckpt2):
    d, first_losses, saved_params, saved_rng = ckpt2
    straight_losses, straight_params = run_ranks(_train_straight, 2)[0]
    path, client, losses, params, rng_after = run_ranks(_load_and_train, 2, d)[0]
    # As DeepSpeed: this rank's file in the tag folder, and the program's client_state with
    # the bookkeeping DeepSpeed also hands back.
    assert os.path.dirname(path) == os.path.join(d, "a") and os.path.isfile(path)
    assert {k: client.pop(k) for k in ("epoch", "note")} == {"epoch": 3, "note": ["a"]}
    assert sorted(client) == ["buffer_names", "ds_config", "ds_version", "global_samples"]
    assert client["global_samples"] == HALF * GB and client["ds_version"] == "0.19.8"
    assert torch.equal(rng_after, saved_rng)  # RNG state restored
    assert first_losses + losses == straight_losses  # bitwise
    for name, value in straight_params.items():
        assert torch.equal(params[name], value), name


@pytest.mark.parametrize("src,dst", [(2, 4), (2, 1), (2, 3), (4, 2)])
def test_reshard_continues_like_reference(ckpt2, tmp_path, src, dst):
    if src == 2:
        d, first_losses = ckpt2[0], ckpt2[1]
    else:
        d = str(tmp_path)
        first_losses = run_ranks(_train_and_save, src, d)[0][0]
    _, _, losses, params, _ = run_ranks(_load_and_train, dst, d)[0]
    ref_losses, ref_params = _reference()
    torch.testing.assert_close(torch.tensor(first_losses + losses), torch.tensor(ref_losses),
                               rtol=1e-5, atol=0)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")


# -- same-process round trip, partial loads, scheduler ------------------------------------
def _partial_loads(rank, world, save_dir):
    sched = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 8,
                                                          "warmup_max_lr": 3e-3}}}
    a = _engine(world, **sched)
    train_engine(a, _batches()[:3], rank, world)
    a.save_checkpoint(save_dir)  # default tag global_step3
    want = gather_full_state_dict(a.sharded)
    # Loading right after saving, in the same process and engine.
    path, client_state = a.load_checkpoint(save_dir)
    assert os.path.dirname(path) == os.path.join(save_dir, "global_step3")
    assert "global_steps" not in client_state and "optimizer" not in client_state
    assert open(os.path.join(save_dir, "latest")).read() == "global_step3"

    b = _engine(world, **sched)
    _, client_state = b.load_checkpoint(save_dir, load_module_only=True)
    # DeepSpeed hands back what it did not restore: with module only, the counters too.
    assert (client_state["global_steps"], client_state["dp_world_size"]) == (3, world)
    got = gather_full_state_dict(b.sharded)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert b.global_steps == 0 and not b.optimizer.state and b.lr_scheduler.state_dict() != \
        a.lr_scheduler.state_dict()

    c = _engine(world, **sched)
    _, client_state = c.load_checkpoint(save_dir, load_optimizer_states=False,
                                        load_lr_scheduler_states=False)
    assert client_state["optimizer"] is None  # a ZeRO checkpoint's model states hold none
    assert client_state["lr_scheduler"] == a.lr_scheduler.state_dict()
    assert c.global_steps == 3 and not c.optimizer.state
    assert c.lr_scheduler.state_dict() != a.lr_scheduler.state_dict()

    d = _engine(world, **sched)
    d.load_checkpoint(save_dir, tag="global_step3")
    assert d.lr_scheduler.state_dict() == a.lr_scheduler.state_dict()
    assert d.get_lr() == a.get_lr()
    for fa, fd in zip(a.sharded.flats, d.sharded.flats):
        sa, sd = a.optimizer.state[fa.master], d.optimizer.state[fd.master]
        assert sa.keys() == sd.keys() and all(torch.equal(sa[k], sd[k]) for k in sa)
    # Continue both: identical.
    la = train_engine(a, _batches()[3:5], rank, world)
    ld = train_engine(d, _batches()[3:5], rank, world)
    assert la == ld
    # No `latest`: DeepSpeed returns (None, None).
    assert d.load_checkpoint(os.path.join(save_dir, "nowhere")) == (None, None)
    return True


def test_partial_loads_and_scheduler(tmp_path):
    assert run_ranks(_partial_loads, 2, str(tmp_path)) == [True, True]


# -- crash safety -------------------------------------------------------------------------
def _crash_during_save(rank, world, save_dir, tag):
    engine = _engine(world)
    train_engine(engine, _batches()[:2], rank, world)
    if rank == 1:
        from zerolite.checkpoint import st_io
        calls = []

        def dying_write(f, data):
            calls.append(1)
            if len(calls) == 2:  # header written; die half-way through the first tensor
                f.write(data[:len(data) // 2])
                f.flush()
                os._exit(3)
            f.write(data)

        st_io._write_bytes = dying_write
    engine.save_checkpoint(save_dir, tag=tag)


def test_kill_during_save_keeps_previous_checkpoint(ckpt2, tmp_path):
    d = str(tmp_path / "c")
    shutil.copytree(ckpt2[0], d)
    for tag in ("new", "a"):  # a new tag, then re-saving the tag `latest` points to
        with pytest.raises(RankFailed, match="rank 1 died"):
            run_ranks(_crash_during_save, 2, d, tag)
        assert open(os.path.join(d, "latest")).read() == "a"
    _, _, _, params, _ = run_ranks(_load_and_train, 2, d)[0]  # still loads, trains as before
    straight = run_ranks(_load_and_train, 2, ckpt2[0])[0][3]
    assert all(torch.equal(params[k], straight[k]) for k in straight)


# -- consolidation -------------------------------------------------------------------------
def test_consolidate_roundtrip(ckpt2, tmp_path):
    d, _, saved, _ = ckpt2
    out = tmp_path / "out"
    assert consolidate_checkpoint(d, out) == ["model.safetensors"]
    sd = load_file(out / "model.safetensors")
    model = GPT(TINY)
    model.load_state_dict(sd, strict=True)
    assert sd.keys() == model.state_dict().keys()  # tied weight under both names
    for name, value in saved.items():
        assert torch.equal(sd[name], value), name
    # Python API
    model2 = load_state_dict_from_checkpoint(GPT(TINY), d)
    assert all(torch.equal(p, saved[n]) for n, p in model2.state_dict().items())
    assert get_fp32_state_dict(d, tag="b").keys() == sd.keys()
    # rank files are valid safetensors for the official library too
    rank0 = [f for f in os.listdir(os.path.join(d, "a")) if f.startswith("zero_rank00000")][0]
    assert "unit0/flat0/param" in load_file(os.path.join(d, "a", rank0))


def test_consolidate_sharded_bf16_cli(ckpt2, tmp_path):
    d, _, saved, _ = ckpt2
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "zerolite.checkpoint.consolidate", d, str(out),
                        "--dtype", "bf16", "--max-shard-size", "20KB", "--tag", "a"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    sd = {}
    for f in files:
        part = load_file(out / f)
        # a tensor (with its tied aliases) larger than the limit gets a shard of its own
        assert sum(t.numel() * 2 for t in part.values()) <= 20_000 or \
            set(part) <= {"tok_emb.weight", "lm_head.weight"}
        sd.update(part)
    assert sd.keys() == index["weight_map"].keys()
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    GPT(TINY).load_state_dict(sd, strict=True)
    assert torch.equal(sd["lm_head.weight"], saved["lm_head.weight"].bfloat16())
    r = subprocess.run([sys.executable, "-m", "zerolite.checkpoint.consolidate", d, str(out),
                        "--tag", "zzz"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "'zzz'" in r.stderr and "['a', 'b']" in r.stderr


GATHER_16BIT = {"stage3_gather_16bit_weights_on_model_save": True}


def _sixteen_bit(rank, world, out_dir, bf16, gather_key, *name):
    zero = {"stage": 3, **({} if gather_key is None else
                           {"stage3_gather_16bit_weights_on_model_save": gather_key})}
    engine = _engine(world, bf16=bf16, zero_optimization=zero)
    train_engine(engine, _batches()[:4], rank, world)
    sd = engine._zero3_consolidated_16bit_state_dict()
    return sd, engine.save_16bit_model(out_dir, *name)


def test_save_16bit_model_holds_the_trained_weights(tmp_path):
    """fp32 run: the file holds what single-process PyTorch trained on the same batches."""
    ref_losses, ref_params = train_reference(tiny_gpt(), _batches()[:4], adamw, clip=CLIP)
    (sd, saved), (sd1, saved1) = run_ranks(_sixteen_bit, 2, str(tmp_path), False, True)
    assert saved is saved1 is True and sd1 == {}
    # DeepSpeed's default: torch.save of the state dict as pytorch_model.bin.
    assert os.listdir(tmp_path) == ["pytorch_model.bin"]
    on_disk = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert on_disk.keys() == ref_params.keys()
    for name, ref in ref_params.items():
        # atol as test_parity_stage3 (Adam on near-zero grads: fp32 summation-order noise)
        torch.testing.assert_close(on_disk[name], ref, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")


def test_save_16bit_model_bf16_file(tmp_path):
    sd, saved = run_ranks(_sixteen_bit, 2, str(tmp_path), True, True,
                          "model.safetensors")[0]
    assert saved is True
    on_disk = load_file(tmp_path / "model.safetensors")  # the name asks for safetensors
    assert on_disk.keys() == sd.keys() == GPT(TINY).state_dict().keys()
    assert all(v.dtype == torch.bfloat16 for v in on_disk.values())
    GPT(TINY).load_state_dict(on_disk, strict=True)


@pytest.mark.parametrize("gather_key", [False, None])
def test_save_16bit_model_at_stage3_needs_the_gather_key(tmp_path, gather_key):
    """As DeepSpeed: without stage3_gather_16bit_weights_on_model_save (default false) stage
    3 saves nothing and returns False on every rank."""
    results = run_ranks(_sixteen_bit, 2, str(tmp_path), False, gather_key)
    assert [saved for _, saved in results] == [False, False]
    assert os.listdir(tmp_path) == []


# -- bad input ------------------------------------------------------------------------------
def _expect_error(fn) -> str:
    try:
        fn()
    except (ZeroliteError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("no error raised")


def _bad_inputs(rank, world, cases):
    engine = _engine(world)
    out = {name: _expect_error(lambda d=d: engine.load_checkpoint(d)) for name, d in cases.items()}
    out["tag"] = _expect_error(lambda: engine.load_checkpoint(cases["missing"], tag="nope"))
    other = GPT(GPTConfig(vocab_size=256, seq_len=16, n_layer=3, n_head=2, d_model=32))
    e2 = _engine(world, model=other)
    out["layout"] = _expect_error(lambda: e2.load_checkpoint(cases["missing"] + "_ok"))
    client = {"epoch": 1, "extra": {"t": object()}} if rank == 1 else {"epoch": 1}
    out["client"] = _expect_error(lambda: engine.save_checkpoint(cases["missing"] + "_ok",
                                                                 tag="bad", client_state=client))
    return out


def _rank_file(d, tag, rank):
    return os.path.join(d, tag, [f for f in os.listdir(os.path.join(d, tag))
                                 if f.startswith(f"zero_rank{rank:05d}")][0])


def test_bad_inputs_fail_clearly_on_every_rank(ckpt2, tmp_path):
    src = ckpt2[0]
    cases = {}
    for name in ("missing", "truncated", "corrupted", "mixed"):
        cases[name] = str(tmp_path / name)
        shutil.copytree(src, cases[name])
    shutil.copytree(src, cases["missing"] + "_ok")
    os.remove(_rank_file(cases["missing"], "a", 1))
    with open(_rank_file(cases["truncated"], "a", 1), "r+b") as f:
        f.truncate(os.path.getsize(f.name) - 100)
    with open(_rank_file(cases["corrupted"], "a", 0), "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\x7f" * 8)
    shutil.copyfile(_rank_file(src, "b", 1), _rank_file(cases["mixed"], "a", 1))

    results = run_ranks(_bad_inputs, 2, cases)
    for r in results:
        assert r["missing"].startswith("ZeroliteCheckpointError") and "zero_rank00001" in \
            r["missing"] and "missing" in r["missing"]
        assert "zero_rank00001" in r["truncated"] and "truncated" in r["truncated"]
        assert "zero_rank00000" in r["corrupted"] and "sha256" in r["corrupted"]
        assert "zero_rank00001" in r["mixed"] and "mixed" in r["mixed"]
        assert "'nope'" in r["tag"] and "['a', 'b']" in r["tag"]
        assert "do not match" in r["layout"] and "blocks.2." in r["layout"]
        assert r["client"].startswith("TypeError") and "client_state['extra']['t']" in r["client"]
    assert not os.path.exists(os.path.join(cases["missing"] + "_ok", "bad"))  # nothing written
