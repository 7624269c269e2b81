"""Accelerate scripts (Accelerator(deepspeed_plugin=...), accelerator.prepare/backward/
accumulate, a client torch optimizer, a client LR scheduler) on zerolite as DeepSpeed at world
2, ZeRO-3, against plain single-process PyTorch on the same global batches: per-step losses,
the lr of every param group at every step, and final weights."""
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
SCRIPTS = os.path.join(ROOT, "tests", "compat_scripts")
SCRIPT = os.path.join(SCRIPTS, "accelerate_mlp.py")


def _script_module(path=SCRIPT):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _launch(script, out, world, *args):
    """torchrun the script under the alias; returns the per-rank results."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(world), "-m", "zerolite.as_deepspeed", script, "--out", str(out), *args]
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    # Note: a finished run must exit 0. The abort at interpreter exit this test once reported
    # as xfail (the watchdog thread in a store call at finalization) is fixed (issue 24).
    assert proc.returncode == 0, output[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def check_mlp_against_reference(runs, world):
    """accelerate_mlp.py's per-rank results against plain PyTorch on the same global batches:
    per-step losses and final weights."""
    from zerolite.testing.reference import train_reference

    m = _script_module()
    x, y = m.data(world)
    per_step = m.GAS * m.MICRO * world
    # Accelerate shards batches round-robin over ranks, so an optimizer step covers the next
    # GAS x world micro-batches in order: the same rows as one reference batch.
    batches = [(x[i:i + per_step], y[i:i + per_step]) for i in range(0, len(x), per_step)]
    model, _ = m.model_and_optimizer()
    ref_losses, ref_state = train_reference(copy.deepcopy(model), batches,
                                            lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01),
                                            clip=m.CLIP)
    assert [r["engine"] for r in runs] == ["ZeroEngine"] * world
    micro = torch.tensor([r["losses"] for r in runs])  # rank x micro-batch
    losses = micro.view(world, -1, m.GAS).mean(dim=(0, 2))
    torch.testing.assert_close(losses, torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for name, value in ref_state.items():
        got = torch.tensor(runs[0]["state"][name])
        torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6, msg=name)


def test_accelerate_deepspeed_plugin_matches_single_process(tmp_path):
    runs = _launch(SCRIPT, tmp_path, 2)
    check_mlp_against_reference(runs, 2)
    assert not any(r["compiled"] for r in runs)


@pytest.mark.slow
def test_accelerate_dynamo_backend_compiles_the_engine_and_matches(tmp_path):
    """Accelerator(dynamo_backend=...): Accelerate calls engine.compile(backend=...,
    compile_kwargs=...) after deepspeed.initialize; training is still the reference's."""
    runs = _launch(SCRIPT, tmp_path, 2, "--dynamo", "eager")
    check_mlp_against_reference(runs, 2)
    assert all(r["compiled"] for r in runs)


def test_accelerate_client_scheduler_drives_every_group_and_resumes(tmp_path):
    """The loop of run_clm_no_trainer.py: the cosine warm-up schedule is Accelerate's to step
    (it never reaches deepspeed.initialize) and moves the lr in the client AdamW's two groups;
    the engine must train with those lrs, from the first step to the resumed ones."""
    from zerolite.testing.reference import train_reference

    m = _script_module(os.path.join(SCRIPTS, "accelerate_schedule.py"))
    world = 2
    x, y = m.data(world)
    per_step = m.GAS * m.MICRO * world
    batches = [(x[i:i + per_step], y[i:i + per_step]) for i in range(0, len(x), per_step)]
    model, groups = m.model_and_groups()
    ref_losses, ref_state = train_reference(
        model, batches, lambda g: torch.optim.AdamW(g, lr=m.LR), clip=m.CLIP, params=groups,
        make_scheduler=lambda opt: m.schedule(opt, world), scheduler_steps=world)
    lr_probe = torch.optim.SGD([{"params": [torch.zeros(1)]}, {"params": [torch.zeros(1)]}],
                               lr=m.LR)
    probe = m.schedule(lr_probe, world)
    ref_lrs = []
    for _ in range(m.STEPS):
        ref_lrs.append([g["lr"] for g in lr_probe.param_groups])
        for _ in range(world):
            lr_probe.step()  # no grads: nothing moves; keeps torch's call-order check quiet
            probe.step()
    assert ref_lrs[0] == [0.0, 0.0] and ref_lrs[m.WARMUP] == [m.LR, m.LR]  # warm-up, then decay

    runs = _launch(os.path.join(SCRIPTS, "accelerate_schedule.py"), tmp_path, world)
    assert runs[0]["engine"] == "ZeroEngine"
    for r in runs:
        assert r["lrs"] == ref_lrs and r["resumed_lrs"] == ref_lrs[m.SAVE_AT:]
    micro = torch.tensor([r["losses"] for r in runs])  # rank x micro-batch
    losses = micro.view(world, -1, m.GAS).mean(dim=(0, 2))
    torch.testing.assert_close(losses, torch.tensor(ref_losses), rtol=1e-5, atol=0)
    resumed = torch.tensor([r["resumed_losses"] for r in runs]).view(world, -1, m.GAS)
    torch.testing.assert_close(resumed.mean(dim=(0, 2)), torch.tensor(ref_losses[m.SAVE_AT:]),
                               rtol=1e-5, atol=0)
    for key in ("state", "resumed_state"):
        for name, value in ref_state.items():
            torch.testing.assert_close(torch.tensor(runs[0][key][name]), value, rtol=1e-5,
                                       atol=1e-6, msg=f"{key} {name}")
