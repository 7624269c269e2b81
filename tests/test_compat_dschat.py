"""Acceptance: DeepSpeed-Chat's step-1 program (compat_scripts/dschat_sft.py, written as that
program is) run unchanged by `torchrun -m zerolite.as_deepspeed` at world 2, ZeRO-3, against
the same program without DeepSpeed in one process.

It checks what DeepSpeed-Chat relies on and a plain Trainer run does not reach: the model
built by `from_pretrained` under `HfDeepSpeedConfig` (partitioned by zero.Init while it
loads), `resize_token_embeddings` under ZeRO-3 (a plain embedding swapped in while gathered,
the tied head following it), FusedAdam with weight-decay groups and a Transformers cosine
schedule passed to initialize, perplexity under `model.eval()`, `model.tput_timer`, and the
ZeRO-3 save that gathers one parameter at a time and keeps `v.data.cpu()` (on a CPU engine
that is the gathered buffer itself, so it must not be recycled by the next gather).

Its step 3 runs in miniature (compat_scripts/dschat_rlhf.py) on the model step 1 trained:
four ZeRO-3 engines in one process (actor and critic training, reference and reward models
in engines without an optimizer), the critic and reward model built by `from_config` under
zero.Init and loaded rank 0 only through `GatheredParameters(modifier_rank=0)`, generation with
`synced_gpus=True`, and `forward_value` called on the engines, so the body and value head run
as modules called on their own. The same pieces are also checked one by one on the tiny GPT.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "dschat_sft.py")
RLHF = os.path.join(ROOT, "tests", "compat_scripts", "dschat_rlhf.py")
# k_proj's bias has an exactly zero gradient (softmax ignores a shift of every score by the
# same amount), so Adam normalises rounding noise into updates of ~lr/1e3: compared loosely.
ZERO_GRAD = "k_proj.bias"


def _run(args, cwd, ranks=0, script=SCRIPT):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60",
               HF_HUB_OFFLINE="1")
    launch = [sys.executable]
    if ranks:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(ranks), "-m", "zerolite.as_deepspeed"]
    proc = subprocess.run(launch + [script, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


def _results(out, ranks=2):
    return [json.loads((out / f"result_rank{r}.json").read_text()) for r in range(ranks)]


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    path = tmp_path_factory.mktemp("dschat") / "init"
    _run(["--make-init", str(path)], path.parent)
    return path


def _train_both(init, tmp_path, *extra):
    common = ["--model_name_or_path", str(init), *extra]
    _run([*common, "--zero_stage", "3", "--output_dir", str(tmp_path / "ds")], tmp_path, ranks=2)
    _run([*common, "--reference", "2", "--init_state", str(tmp_path / "ds/init/pytorch_model.bin"),
          "--output_dir", str(tmp_path / "ref")], tmp_path)
    return _results(tmp_path / "ds"), _results(tmp_path / "ref")


def _assert_same_training(ds, ref, tmp_path, gas=1):
    for mine, theirs in zip(ds, ref):
        losses = torch.tensor(theirs["loss"], dtype=torch.float64)
        assert len(losses) == 12 and losses[-4:].mean() < losses[:4].mean() - 0.2  # it learns
        torch.testing.assert_close(torch.tensor(mine["loss"], dtype=torch.float64), losses,
                                   rtol=1e-6, atol=0)
        assert mine["lr"] == pytest.approx(theirs["lr"], rel=1e-12)
        assert mine["ppl"] == pytest.approx(theirs["ppl"], rel=1e-6)
        assert mine["ppl"][-1] < mine["ppl"][0] * 0.8
        assert mine["epochs"] == 2
        # tput_timer: micro-steps per epoch (reset by update_epoch_count), optimizer steps in
        # all, samples per second from the third step on
        micro = len(losses) // 2
        steps = micro // gas
        assert [t[:2] for t in mine["tput"]] == [[micro, steps], [micro, 2 * steps]]
        assert mine["tput"][1][2] > 0
    trained, expected = _weights(tmp_path / "ds/pytorch_model.bin"), _weights(
        tmp_path / "ref/pytorch_model.bin")
    assert sorted(trained) == sorted(expected)
    for name, value in trained.items():
        tol = dict(rtol=0, atol=1e-4) if ZERO_GRAD in name else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(value, expected[name], **tol, msg=name)


@pytest.fixture(scope="module")
def sft(init, tmp_path_factory):
    """Step 1 at world 2 and its reference: (folder, ZeRO-3 results, reference results)."""
    path = tmp_path_factory.mktemp("sft")
    ds, ref = _train_both(init, path)
    return path, ds, ref


def test_dschat_sft_zero3_matches_single_process(init, sft):
    tmp_path, ds, ref = sft
    _assert_same_training(ds, ref, tmp_path)
    assert all(r["param_dtype"] == "torch.float32" and not r["checkpointing"] for r in ds)

    # What the model was before training, written by DeepSpeed-Chat's own ZeRO-3 save right
    # after resize_token_embeddings: the pretrained weights exactly, the embedding grown from
    # 50 to 56 rows (53 tokens, rounded up to 8) with its first 50 rows kept.
    from safetensors.torch import load_file

    pretrained = load_file(str(init / "model.safetensors"))
    start = _weights(tmp_path / "ds/init/pytorch_model.bin")
    assert sorted(start) == sorted(pretrained)
    for name, value in pretrained.items():
        if name == "model.decoder.embed_tokens.weight":
            assert start[name].shape == (56, 32)
            assert torch.equal(start[name][:50], value)
            assert start[name][50:].abs().sum() > 0
        else:
            assert torch.equal(start[name], value), name

    # The saved model is an ordinary Transformers model (config.json from rank 0's
    # save_hf_format, weights from the ZeRO-3 save that replaced its empty tensors).
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ds"))
    trained = _weights(tmp_path / "ds/pytorch_model.bin")
    for name, value in reloaded.named_parameters():
        assert torch.equal(value.detach(), trained[name]), name
    assert reloaded.lm_head.weight is reloaded.model.decoder.embed_tokens.weight


def test_dschat_rlhf_step_matches_single_process(sft, tmp_path):
    """Step 3 in miniature on step 1's model: sequences generated, reward scores, actor and
    critic losses of every rank and step, and the four models' norms at the end."""
    actor = sft[0] / "ds"
    _run(["--make-critic", str(actor), str(tmp_path / "critic")], tmp_path, script=RLHF)
    common = ["--actor", str(actor), "--critic", str(tmp_path / "critic")]
    _run([*common, "--output_dir", str(tmp_path / "ds")], tmp_path, ranks=2, script=RLHF)
    _run([*common, "--reference", "2", "--output_dir", str(tmp_path / "ref")], tmp_path,
         script=RLHF)
    ds, ref = _results(tmp_path / "ds"), _results(tmp_path / "ref")
    # The stage-3 reference and reward engines have no optimizer: their `optimizer` is the hook
    # owner, as DeepSpeed's DeepSpeedZeRoOffload.
    assert ds[0]["ref_optimizer"] == ["ParameterOffload", "ParameterOffload"]
    for mine, theirs in zip(ds, ref):
        assert len(mine["steps"]) == 3
        for step, (a, b) in enumerate(zip(mine["steps"], theirs["steps"])):
            assert a["seq"] == b["seq"], step
            assert a["score"] == pytest.approx(b["score"], rel=1e-5, abs=1e-6)
            assert a["actor_loss"] == pytest.approx(b["actor_loss"], rel=1e-5, abs=1e-6)
            assert a["critic_loss"] == pytest.approx(b["critic_loss"], rel=1e-5, abs=1e-6)
        assert mine["norms"] == pytest.approx(theirs["norms"], rel=1e-6)
    # the ranks generated from different prompts, and the actor moved away from the reference
    assert ds[0]["steps"][0]["seq"] != ds[1]["steps"][0]["seq"]
    assert ds[0]["norms"][0] != pytest.approx(ds[0]["norms"][1], rel=1e-6)


@pytest.mark.slow
def test_dschat_sft_accumulation_and_checkpointing_match(init, tmp_path):
    ds, ref = _train_both(init, tmp_path, "--gradient_accumulation_steps", "2",
                          "--gradient_checkpointing")
    _assert_same_training(ds, ref, tmp_path, gas=2)
    assert all(r["checkpointing"] for r in ds)


@pytest.mark.slow
def test_dschat_sft_lora_matches(init, tmp_path):
    """DeepSpeed-Chat's own LoRA (--lora_dim --only_optimize_lora): its layer takes over the
    partitioned Linear weight (sized by `ds_shape`), only the factors train, and at the end it
    fuses them into the weights under `GatheredParameters(modifier_rank=0)` before its save.
    Its code imports `deepspeed.compression.helper` (kept by DeepSpeed 0.19 for it)."""
    ds, ref = _train_both(init, tmp_path, "--lora_dim", "4", "--only_optimize_lora")
    for mine, theirs in zip(ds, ref):
        torch.testing.assert_close(torch.tensor(mine["loss"]), torch.tensor(theirs["loss"]),
                                   rtol=1e-6, atol=0)
        assert mine["ppl"] == pytest.approx(theirs["ppl"], rel=1e-6)
        assert mine["ppl"][-1] < mine["ppl"][0]
    trained, expected = _weights(tmp_path / "ds/pytorch_model.bin"), _weights(
        tmp_path / "ref/pytorch_model.bin")
    start = _weights(tmp_path / "ds/init/pytorch_model.bin")
    assert sorted(trained) == sorted(expected) and not any("lora" in k for k in trained)
    for name, value in trained.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    fused = "model.decoder.layers.0.fc1.weight"
    assert (trained[fused] - start[fused]).abs().max() > 1e-3  # the factors went into it
    assert torch.equal(trained["model.decoder.embed_tokens.weight"],
                       start["model.decoder.embed_tokens.weight"])  # frozen


@pytest.mark.slow
def test_dschat_sft_bfloat16_block_is_honoured(init, tmp_path):
    """DeepSpeed-Chat spells bf16 as the "bfloat16" block: the model trains in bf16 and stays
    within bf16's precision of the fp32 reference."""
    ds, ref = _train_both(init, tmp_path, "--dtype", "bf16")
    for mine, theirs in zip(ds, ref):
        assert mine["param_dtype"] == "torch.bfloat16"
        torch.testing.assert_close(torch.tensor(mine["loss"]), torch.tensor(theirs["loss"]),
                                   rtol=2e-3, atol=0)
    trained = _weights(tmp_path / "ds/pytorch_model.bin")
    assert {v.dtype for v in trained.values()} == {torch.bfloat16}


class Critic(torch.nn.Module):
    """DeepSpeed-Chat's reward/critic model shape: a transformer body and a value head, with
    the method the program calls through the engine (`critic_engine.forward_value(...)`) not
    being `forward`, so neither the engine's forward nor the root module's runs."""

    def __init__(self, body):
        super().__init__()
        self.rwtransformer = body
        self.v_head = torch.nn.Linear(body.cfg.d_model, 1, bias=False)

    def forward_value(self, idx):
        body = self.rwtransformer
        x = body.tok_emb(idx) + body.pos_emb(torch.arange(idx.shape[1]))
        for block in body.blocks:
            x = block(x)
        return self.v_head(body.ln_f(x)).squeeze(-1)

    def forward(self, idx, targets):  # the reference's loss, the same computation
        return value_loss(self.forward_value(idx), targets)


def value_loss(values, targets):
    return ((values - targets.float() / 256) ** 2).mean()


def _critic(seed=0):
    from gpt_cases import TINY, tiny_gpt

    import dataclasses

    torch.manual_seed(seed)
    body = tiny_gpt(seed, cfg=dataclasses.replace(TINY, n_layer=4))
    torch.manual_seed(seed + 1)
    return Critic(body)


def _train_critic_through_forward_value(rank, world):
    import zerolite
    from zerolite.testing.reference import rank_micro_batches
    from zerolite.zero.sharded_model import gather_full_state_dict

    from gpt_cases import batches, ds_config

    cfg = ds_config(world)
    block = 12 * 32 ** 2 + 13 * 32
    # one block prefetched and one gradient in flight: pooled buffers are reused
    cfg["zero_optimization"].update(stage3_prefetch_bucket_size=block, reduce_bucket_size=block)
    engine, *_ = zerolite.initialize(model=_critic(), config=cfg)
    losses = []
    for batch in batches(6):
        total = torch.zeros((), dtype=torch.float64)
        for x, y in rank_micro_batches(batch, rank, world, engine.gradient_accumulation_steps()):
            loss = value_loss(engine.forward_value(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / (world * engine.gradient_accumulation_steps()))
    return {"losses": losses, "params": gather_full_state_dict(engine.sharded)}


def test_critic_forward_value_through_the_engine_matches_reference():
    import copy

    from zerolite.testing.multiprocess import run_ranks
    from zerolite.testing.reference import train_reference

    from gpt_cases import CLIP, adamw, batches

    ref_losses, ref_params = train_reference(copy.deepcopy(_critic()), batches(6), adamw,
                                             clip=CLIP)
    assert ref_losses[-1] < ref_losses[0] * 0.8
    for r in run_ranks(_train_critic_through_forward_value, 2):
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref_losses),
                                   rtol=1e-5, atol=0)
        for name, value in ref_params.items():
            torch.testing.assert_close(r["params"][name], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{name}: {m}")


def _engines_side_by_side(rank, world):
    """DeepSpeed-Chat step 3's shape: an actor and a critic training in turns, and a frozen
    reference model as an engine without an optimizer, all ZeRO-3 in one process."""
    import zerolite
    from zerolite.testing.reference import rank_micro_batches

    from gpt_cases import batches, ds_config, tiny_gpt

    actor, *_ = zerolite.initialize(model=tiny_gpt(0), config=ds_config(world))
    critic, *_ = zerolite.initialize(model=_critic(1), config=ds_config(world))
    eval_config = {k: v for k, v in ds_config(world).items() if k != "optimizer"}
    ref, *_ = zerolite.initialize(model=tiny_gpt(0), config=eval_config)
    ref.eval()
    out = {"actor": [], "critic": [], "ref_logits": [],
           "ref_optimizer": type(ref.optimizer).__name__}
    gas = actor.gradient_accumulation_steps()
    for batch in batches(4):
        with torch.no_grad():  # "generate_experience": every model, no grad
            x0 = rank_micro_batches(batch, rank, world, gas)[0][0]
            out["ref_logits"].append(ref(x0))
            actor.eval(), critic.eval()
            actor(x0), critic.forward_value(x0)
            actor.train(), critic.train()
        for x, y in rank_micro_batches(batch, rank, world, gas):
            loss = actor(x, y)
            actor.backward(loss)
            actor.step()
            value = value_loss(critic.forward_value(x), y)
            critic.backward(value)
            critic.step()
            out["actor"].append(loss.item())
            out["critic"].append(value.item())
    return out


def test_actor_critic_and_frozen_reference_engines_side_by_side():
    import copy

    from zerolite.testing.multiprocess import run_ranks
    from zerolite.testing.reference import rank_micro_batches, train_reference

    from gpt_cases import CLIP, GAS, adamw, batches, tiny_gpt

    # The references train on the whole global batch; each step's first micro-step loss of
    # every rank is recomputed from the reference weights at the start of that step.
    actor_ref, critic_ref = tiny_gpt(0), _critic(1)
    frozen = tiny_gpt(0)
    actor_states, critic_states = [], []
    for steps in range(4):
        actor_states.append(train_reference(copy.deepcopy(tiny_gpt(0)), batches(4)[:steps],
                                            adamw, clip=CLIP)[1])
        critic_states.append(train_reference(copy.deepcopy(_critic(1)), batches(4)[:steps],
                                             adamw, clip=CLIP)[1])
    results = run_ranks(_engines_side_by_side, 2)
    for rank, out in enumerate(results):
        assert out["ref_optimizer"] == "ParameterOffload"  # DeepSpeed's DeepSpeedZeRoOffload
        for step, batch in enumerate(batches(4)):
            actor_ref.load_state_dict(actor_states[step])
            critic_ref.load_state_dict(critic_states[step])
            micro = rank_micro_batches(batch, rank, 2, GAS)
            with torch.no_grad():
                torch.testing.assert_close(out["ref_logits"][step], frozen(micro[0][0]),
                                           rtol=1e-6, atol=1e-6)
                # the first micro-step of each step runs on the step's starting weights
                x, y = micro[0]
                assert out["actor"][step * GAS] == pytest.approx(actor_ref(x, y).item(), rel=1e-5)
                assert out["critic"][step * GAS] == pytest.approx(critic_ref(x, y).item(),
                                                                  rel=1e-5)
