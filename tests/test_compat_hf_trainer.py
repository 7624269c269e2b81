"""Acceptance: an unchanged Hugging Face Trainer script with the Transformers docs' ZeRO-3
"auto" config runs on zerolite as DeepSpeed (world 2) and matches the same script on one
process without DeepSpeed: per-step losses (gradient accumulation 2) within 1e-4 in fp32, the
eval loss, the model `save_model` wrote (reloaded here, a fresh process), and a resume from
the Trainer's step-3 checkpoint that continues the same loss curve."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "hf_trainer_gpt2.py")
CONFIG = os.path.join(ROOT, "tests", "compat_scripts", "hf_ds_config_zero3_auto.json")
STEPS, GAS = 6, 2


def _init_model(path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=16, n_embd=64, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)


def _run(cmd, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return time.perf_counter() - start


def _per_step(micro_by_rank):
    """Global loss per optimizer step: the mean over every rank's micro-batches (all equal in
    size) of that step."""
    per_rank = [torch.tensor(m).view(-1, GAS) for m in micro_by_rank]
    return torch.stack(per_rank).mean(dim=(0, 2))


def test_hf_trainer_zero3_matches_single_process(tmp_path):
    init = tmp_path / "init"
    _init_model(init)
    common = ["--init", str(init), "--steps", str(STEPS), "--gas", str(GAS), "--save_steps", "3"]
    ref_s = _run([sys.executable, SCRIPT, "--out", str(tmp_path / "ref"), "--per_device", "4",
                  *common], tmp_path)
    ds_s = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node", "2", "-m", "zerolite.as_deepspeed", SCRIPT,
                 "--out", str(tmp_path / "ds"), "--per_device", "2", "--deepspeed", CONFIG,
                 *common], tmp_path)
    print(f"wall time: single-process reference {ref_s:.1f}s, zerolite as DeepSpeed "
          f"(world 2) {ds_s:.1f}s")
    ref = json.loads((tmp_path / "ref" / "result_rank0.json").read_text())
    ds = [json.loads((tmp_path / "ds" / f"result_rank{r}.json").read_text()) for r in range(2)]
    assert ref["engine"] == "GPT2LMHeadModel" and ds[0]["engine"] == "ZeroEngine"

    ref_steps, ds_steps = _per_step([ref["losses"]]), _per_step([d["losses"] for d in ds])
    assert len(ds_steps) == STEPS
    torch.testing.assert_close(ds_steps, ref_steps, rtol=0, atol=1e-4)
    assert ds_steps[-1] < ds_steps[0] - 0.1  # it learned something: the comparison has teeth
    assert abs(ds[0]["eval_loss"] - ref["eval_loss"]) < 1e-4
    # A Trainer that only evaluates and predicts (DeepSpeed initialized for inference, an
    # engine without an optimizer, whose `optimizer` is the stage-3 hook owner, as DeepSpeed's
    # DeepSpeedZeRoOffload) before any training: the reference's loss and logits.
    for d in ds:
        assert d["eval_engine"] == "ZeroEngine" and d["eval_optimizer"] == "ParameterOffload"
        assert d["eval_only_loss"] == pytest.approx(ref["eval_only_loss"], rel=1e-5)
        assert d["predicted"]["shape"] == ref["predicted"]["shape"] == [16, 16, 128]
        assert d["predicted"]["argmax"] == ref["predicted"]["argmax"]
        assert d["predicted"]["sum"] == pytest.approx(ref["predicted"]["sum"], rel=1e-5)
    assert ref["eval_only_loss"] > ds[0]["eval_loss"] + 0.1  # before training: a higher loss

    # Resuming from checkpoint-3 (a DeepSpeed-layout global_step3 folder) continues the curve.
    assert (tmp_path / "ds" / "run" / "checkpoint-3" / "global_step3").is_dir()
    resumed = _per_step([d["resumed"] for d in ds])
    torch.testing.assert_close(resumed, ds_steps[3:], rtol=0, atol=1e-4)
    torch.testing.assert_close(resumed, ref_steps[3:], rtol=0, atol=1e-4)

    # save_model wrote model.safetensors with the full weights; from_pretrained loads it here.
    assert (tmp_path / "ds" / "final" / "model.safetensors").is_file()
    mine = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ds" / "final").eval()
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ref" / "final").eval()
    ref_sd = theirs.state_dict()
    for name, value in mine.state_dict().items():
        torch.testing.assert_close(value, ref_sd[name], rtol=0, atol=1e-4, msg=name)
    ids = torch.arange(16).view(1, 16) % 128
    with torch.no_grad():
        torch.testing.assert_close(mine(ids).logits, theirs(ids).logits, rtol=0, atol=1e-3)
