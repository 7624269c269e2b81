"""An Accelerate script (Accelerator(deepspeed_plugin=...), accelerator.prepare/backward/
accumulate, a client torch optimizer) on zerolite as DeepSpeed at world 2, ZeRO-3, against
plain single-process PyTorch on the same global batches: per-step losses and final weights."""
import copy
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "accelerate_mlp.py")


def _script_module():
    spec = importlib.util.spec_from_file_location("accelerate_mlp", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_accelerate_deepspeed_plugin_matches_single_process(tmp_path):
    from zerolite.testing.reference import train_reference

    m = _script_module()
    world = 2
    x, y = m.data(world)
    per_step = m.GAS * m.MICRO * world
    # Accelerate shards batches round-robin over ranks, so an optimizer step covers the next
    # GAS x world micro-batches in order: the same rows as one reference batch.
    batches = [(x[i:i + per_step], y[i:i + per_step]) for i in range(0, len(x), per_step)]
    model, _ = m.model_and_optimizer()
    ref_losses, ref_state = train_reference(copy.deepcopy(model), batches,
                                            lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01),
                                            clip=m.CLIP)

    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(world), "-m", "zerolite.as_deepspeed", SCRIPT, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr
    # Note: a finished run must exit 0: the abort at interpreter exit this test once reported
    # as xfail (the watchdog thread in a store call at finalization) is fixed (issue 24).
    assert proc.returncode == 0, output[-5000:]
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert runs[0]["engine"] == "ZeroEngine"
    micro = torch.tensor([r["losses"] for r in runs])  # rank x micro-batch
    losses = micro.view(world, -1, m.GAS).mean(dim=(0, 2))
    torch.testing.assert_close(losses, torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for name, value in ref_state.items():
        got = torch.tensor(runs[0]["state"][name])
        torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6, msg=name)
