"""Acceptance: the same unchanged Hugging Face Trainer script as test_compat_hf_trainer.py,
with the Transformers docs' ZeRO-3 *offload* configs (CPU offload of optimizer and params;
NVMe offload of both, as the docs' ZeRO-Infinity example writes it), runs on zerolite as
DeepSpeed at world 2 and matches the single-process run without DeepSpeed: per-step losses,
the eval loss, the saved model and a resume from the Trainer's step-3 checkpoint."""
import json
import os
import sys

import pytest
import torch

from test_compat_hf_trainer import CONFIG, GAS, SCRIPT, STEPS, _init_model, _per_step, _run

transformers = pytest.importorskip("transformers")


def _offload_config(tmp_path, device):
    with open(CONFIG) as f:
        cfg = json.load(f)
    zero = cfg["zero_optimization"]
    if device == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    else:  # the docs' NVMe example, nvme_path pointed at a scratch dir
        swap = str(tmp_path / "local_nvme")
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": swap, "pin_memory": True,
                                     "buffer_count": 4, "fast_init": False}
        zero["offload_param"] = {"device": "nvme", "nvme_path": swap, "pin_memory": True,
                                 "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9}
        cfg["aio"] = {"block_size": 262144, "queue_depth": 32, "thread_count": 1,
                      "single_submit": False, "overlap_events": True}
    path = tmp_path / f"ds_offload_{device}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_ref")
    _init_model(tmp / "init")
    _run([sys.executable, SCRIPT, "--init", str(tmp / "init"), "--out", str(tmp / "ref"),
          "--per_device", "4", "--steps", str(STEPS), "--gas", str(GAS), "--save_steps", "3"],
         tmp)
    return tmp


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_hf_trainer_zero3_offload_matches_single_process(reference, tmp_path, device):
    cfg = _offload_config(tmp_path, device)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          "-m", "zerolite.as_deepspeed", SCRIPT, "--init", str(reference / "init"),
          "--out", str(tmp_path / "ds"), "--per_device", "2", "--deepspeed", cfg,
          "--steps", str(STEPS), "--gas", str(GAS), "--save_steps", "3"], tmp_path)
    ref = json.loads((reference / "ref" / "result_rank0.json").read_text())
    ds = [json.loads((tmp_path / "ds" / f"result_rank{r}.json").read_text()) for r in range(2)]

    facts = ds[0]["offload"]  # the engine the Trainer built offloads what the config says
    assert facts["cpu_offload"] == (device == "cpu") and facts["cpu_optimizer"]
    assert facts["param_device"] == device
    assert facts["optimizer_class"] == ("ChunkedOffloadOptimizer" if device == "nvme"
                                        else "DeepSpeedCPUAdam")  # as DeepSpeed builds it
    if device == "nvme":  # each rank's swap dirs lived under nvme_path and were removed
        swap = tmp_path / "local_nvme"
        assert swap.is_dir() and list(swap.iterdir()) == []

    ref_steps, ds_steps = _per_step([ref["losses"]]), _per_step([d["losses"] for d in ds])
    assert len(ds_steps) == STEPS
    torch.testing.assert_close(ds_steps, ref_steps, rtol=0, atol=1e-4)
    assert ds_steps[-1] < ds_steps[0] - 0.1
    assert abs(ds[0]["eval_loss"] - ref["eval_loss"]) < 1e-4
    resumed = _per_step([d["resumed"] for d in ds])
    torch.testing.assert_close(resumed, ref_steps[3:], rtol=0, atol=1e-4)

    mine = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ds" / "final")
    ref_sd = transformers.GPT2LMHeadModel.from_pretrained(reference / "ref" / "final").state_dict()
    for name, value in mine.state_dict().items():
        torch.testing.assert_close(value, ref_sd[name], rtol=0, atol=1e-4, msg=name)
