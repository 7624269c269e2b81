"""Acceptance: TRL's SFTTrainer and GRPOTrainer, unchanged, on zerolite as DeepSpeed ZeRO-3
(world 2, CPU/gloo), on a tiny Qwen2 with a character tokenizer built locally
(compat_scripts/trl_tiny.py).

SFT (its chunked loss reads lm_head.weight.ds_status, forward and backward) gives the losses
and grad norms of the same script on one process without DeepSpeed, then samples from the
trained model through TRL's `unwrap_model_for_generation` (gather, drop the hooks, generate,
re-add them) with the reference's completions. GRPO generates every step that way on both
ranks and gives the losses, rewards and completion lengths of the same script under DDP
(world 2, same seeds); after each generation the parameters are partitioned again, the hooks
are back, and the next step's gathers happen."""
import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
pytest.importorskip("trl")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "trl_tiny.py")
CONFIG = os.path.join(ROOT, "tests", "compat_scripts", "hf_ds_config_zero3_auto.json")
UNITS = 3  # the root and the two decoder layers
OWNERS = 3 + 2 * 9  # modules holding parameters: embed, norm, head; 4 attn, 3 mlp, 2 norms
NORMS = 1 + 2 * 2  # the owners whose every parameter is persistent: the "auto" threshold
# (10 x hidden) keeps each RMSNorm weight (and the attention biases) gathered between steps
HOOKS = [2 * UNITS + 2 * (OWNERS - NORMS) + NORMS, 2 * UNITS]
"""Forward: per unit a pre/post pair, per owner with a sharded parameter a direct-call pair,
per fully persistent owner one use pre-hook (zero/hooks.py); backward: a pair per unit."""
PERSISTENT = 5 * 32 + 2 * (32 + 16 + 16)  # the RMSNorm weights and q/k/v biases
BETWEEN_STEPS = ["AVAILABLE", "NOT_AVAILABLE"]
"""ds_status between steps: the persistent parameters stay gathered, as DeepSpeed's do (the
records of tests/test_ds_clients.py agree with DeepSpeed's here)."""


def _run(args, cwd, ranks=1, alias=False):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        launch += ["-m", "zerolite.as_deepspeed"] if alias else []
    proc = subprocess.run(launch + [SCRIPT, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


def _results(out, ranks):
    return [json.loads((out / f"result_rank{r}.json").read_text()) for r in range(ranks)]


def _series(result, key):
    return torch.tensor([entry[key] for entry in result["log"] if key in entry and
                         "train_runtime" not in entry], dtype=torch.float64)


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    path = tmp_path_factory.mktemp("trl") / "init"
    _run(["--make-init", str(path)], path.parent)
    return path


@pytest.mark.slow
def test_trl_sft_zero3_matches_single_process(init, tmp_path):
    common = ["sft", "--init", str(init), "--steps", "4"]
    _run([*common, "--out", str(tmp_path / "ref"), "--per_device", "4"], tmp_path)
    _run([*common, "--out", str(tmp_path / "ds"), "--per_device", "2", "--deepspeed", CONFIG],
         tmp_path, ranks=2, alias=True)
    (ref,) = _results(tmp_path / "ref", 1)
    ds = _results(tmp_path / "ds", 2)
    losses = _series(ref, "loss")
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.2  # it learns: the check has teeth
    for rank in ds:
        torch.testing.assert_close(_series(rank, "loss"), losses, rtol=1e-5, atol=0)
        torch.testing.assert_close(_series(rank, "grad_norm"), _series(ref, "grad_norm"),
                                   rtol=1e-5, atol=0)
        assert rank["samples"] == ref["samples"]  # greedy, from the trained weights
        # after TRL's generation round trip (gather all, release all) the persistent
        # parameters are released too, until their next use
        assert rank["before"]["status"] == BETWEEN_STEPS
        assert rank["after"]["status"] == ["NOT_AVAILABLE"]
        assert rank["during"] == {"status": ["AVAILABLE"], "numel": rank["during"]["numel"],
                                  "hooks": [0, 0], "trace_invalid": False}
        assert rank["before"]["numel"] == PERSISTENT and rank["after"]["numel"] == 0
        assert rank["during"]["numel"] > PERSISTENT
        assert rank["after"]["hooks"] == HOOKS
    assert ref["before"] is None


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_trl_sft_lora_zero3_matches_single_process(init, tmp_path, checkpointing):
    """PEFT's LoRA through SFTTrainer(peft_config=...): adapters added to a model the engine
    then shards with its frozen base; the adapters' modules are called from the base layers'
    forward, and only they train. With gradient checkpointing too (TRL turns on the inputs'
    requires_grad for PEFT, and the layers are recomputed inside backward)."""
    pytest.importorskip("peft")
    common = ["sft", "--init", str(init), "--steps", "4", "--lora"]
    common += ["--checkpointing"] if checkpointing else []
    _run([*common, "--out", str(tmp_path / "ref"), "--per_device", "4"], tmp_path)
    _run([*common, "--out", str(tmp_path / "ds"), "--per_device", "2", "--deepspeed", CONFIG],
         tmp_path, ranks=2, alias=True)
    (ref,) = _results(tmp_path / "ref", 1)
    losses = _series(ref, "loss")
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.05  # the adapters learn
    for rank in _results(tmp_path / "ds", 2):
        torch.testing.assert_close(_series(rank, "loss"), losses, rtol=1e-5, atol=0)
        torch.testing.assert_close(_series(rank, "grad_norm"), _series(ref, "grad_norm"),
                                   rtol=1e-5, atol=0)
        assert rank["samples"] == ref["samples"]
        assert rank["after"]["status"] == ["NOT_AVAILABLE"]
        assert rank["checkpointing"] is ref["checkpointing"] is checkpointing


@pytest.mark.slow
def test_trl_dpo_zero3_matches_single_process(init, tmp_path):
    """DPOTrainer with the reference model TRL builds from the model's path: under ZeRO-3 TRL's
    prepare_deepspeed puts it in a deepspeed.initialize engine without an optimizer (and adds
    its dotted "zero_optimization.*" keys at the top level, which DeepSpeed ignores too)."""
    common = ["dpo", "--init", str(init), "--steps", "4"]
    _run([*common, "--out", str(tmp_path / "ref"), "--per_device", "4"], tmp_path)
    _run([*common, "--out", str(tmp_path / "ds"), "--per_device", "2", "--deepspeed", CONFIG],
         tmp_path, ranks=2, alias=True)
    (ref,) = _results(tmp_path / "ref", 1)
    losses = _series(ref, "loss")
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.1  # the policy moves off the ref
    for rank in _results(tmp_path / "ds", 2):
        # ref_optimizer: is its optimizer None? No: at stage 3 it is the object owning the
        # module hooks, as DeepSpeed's DeepSpeedZeRoOffload (tests/test_ds_conformance.py)
        assert rank["ref_engine"] == "ZeroEngine" and rank["ref_optimizer"] is False
        for key in ("loss", "grad_norm", "rewards/chosen", "rewards/margins"):
            torch.testing.assert_close(_series(rank, key), _series(ref, key), rtol=1e-5,
                                       atol=1e-6, msg=key)
        assert rank["after"]["status"] == BETWEEN_STEPS


@pytest.fixture(scope="module")
def grpo_ddp(init, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo_ddp")
    _run(["grpo", "--init", str(init), "--steps", "4", "--per_device", "2", "--out", str(out)],
         out, ranks=2)
    return _results(out, 2)


@pytest.mark.slow
@pytest.mark.parametrize("gather", [True, False], ids=["gathered", "through_hooks"])
def test_trl_grpo_zero3_generates_and_matches_ddp(init, grpo_ddp, tmp_path, gather):
    """gathered: TRL's default (ds3_gather_for_generation=True): gather all, drop the hooks,
    generate, re-add them. through_hooks: generation runs through zerolite's hooks, unit by
    unit within the prefetch and live budgets."""
    args = ["grpo", "--init", str(init), "--steps", "4", "--per_device", "2",
            "--out", str(tmp_path / "ds"), "--deepspeed", CONFIG]
    args += [] if gather else ["--no-gather"]
    _run(args, tmp_path, ranks=2, alias=True)
    ddp, ds = grpo_ddp, _results(tmp_path / "ds", 2)
    assert ddp[0]["after_generation"] == [None] * 4  # DDP: no ZeRO-3 params
    for rank in ds:
        for key in ("loss", "reward", "reward_std", "completions/mean_length"):
            torch.testing.assert_close(_series(rank, key), _series(ddp[0], key), rtol=1e-5,
                                       atol=1e-6, msg=key)
        assert torch.isfinite(_series(rank, "loss")).all()
        assert len(_series(rank, "reward")) == 4
        # After every generation: partitioned again (TRL's gather round trip releases the
        # persistent parameters too; through the hooks they stay), hooks in place; after
        # TRL's round trip the trace is to be re-recorded.
        kept = {"status": ["NOT_AVAILABLE"], "numel": 0} if gather else \
            {"status": BETWEEN_STEPS, "numel": PERSISTENT}
        assert rank["after_generation"] == [{**kept, "hooks": HOOKS,
                                             "trace_invalid": gather}] * 4
        # Each step after a generation gathers again in its training forward and backward
        # (more than the generation's own gather of every unit).
        assert all(g > UNITS for g in rank["gathers"]) and len(rank["gathers"]) == 4
    assert _series(ds[0], "completions/mean_length").gt(0).all()
