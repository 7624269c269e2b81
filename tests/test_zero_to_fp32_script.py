"""The `zero_to_fp32.py` that save_checkpoint leaves in the checkpoint folder (as DeepSpeed's):
run as DeepSpeed's docs say (`python zero_to_fp32.py . output_dir`, in a subprocess), its output
is the trained model, bit for bit, after a world-2 ZeRO-3 run."""
import os
import stat
import subprocess
import sys

import pytest
import torch

import zerolite
from zerolite.testing.multiprocess import run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.sharded_model import gather_full_state_dict

from gpt_cases import batches, ds_config, tiny_gpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_and_save(rank, world, save_dir):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=3))
    train_engine(engine, batches(2), rank, world)
    engine.save_checkpoint(save_dir, tag="early", save_latest=False)
    train_engine(engine, batches(3)[2:], rank, world)
    engine.save_checkpoint(save_dir)
    return gather_full_state_dict(engine.sharded)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ckpt")
    return save_dir, run_ranks(_train_and_save, 2, str(save_dir))[0]


def _script(save_dir, *args, python=(sys.executable,), script="zero_to_fp32.py"):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.run([*python, script, *args], cwd=save_dir, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["zero_to_fp32.py", "zero_to_torch.py"])
def test_checkpoint_folder_has_the_executable_scripts(saved, name):
    save_dir, _ = saved
    script = save_dir / name
    assert os.stat(script).st_mode & stat.S_IEXEC
    ours = os.path.join(ROOT, "zerolite", "checkpoint", name)
    assert script.read_bytes() == open(ours, "rb").read()
    assert not [n for n in os.listdir(save_dir) if ".tmp" in n]


def test_zero_to_torch_script_writes_the_dtype_asked_for(saved, tmp_path):
    """DeepSpeed 0.19's zero_to_torch.py: `--dtype` (required) picks the output dtype."""
    save_dir, trained = saved
    proc = _script(save_dir, ".", str(tmp_path / "bf16"), "--dtype", "bf16",
                   script="zero_to_torch.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sd = torch.load(tmp_path / "bf16" / "pytorch_model.bin", weights_only=True)
    assert sd.keys() == trained.keys()
    for name, value in trained.items():
        assert sd[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(sd[name], value.to(torch.bfloat16), rtol=0, atol=0, msg=name)
    proc = _script(save_dir, ".", str(tmp_path / "st"), "--dtype", "float16",
                   "--safe_serialization", script="zero_to_torch.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from safetensors.torch import load_file

    sd = load_file(tmp_path / "st" / "model.safetensors")
    assert {v.dtype for v in sd.values()} == {torch.float16}
    for name, value in sd.items():
        torch.testing.assert_close(value, trained[name].to(torch.float16), rtol=0, atol=0)
    proc = _script(save_dir, ".", str(tmp_path / "x"), script="zero_to_torch.py")
    assert proc.returncode == 2 and "--dtype" in proc.stderr  # required, as DeepSpeed's


def test_zero_to_fp32_script_gives_the_trained_model(saved, tmp_path):
    save_dir, trained = saved
    proc = _script(save_dir, ".", str(tmp_path / "bin"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sd = torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)
    model = tiny_gpt(seed=7)
    model.load_state_dict(sd, strict=True)  # every name of the model, nothing else
    for name, value in trained.items():
        torch.testing.assert_close(sd[name], value, rtol=0, atol=0, msg=name)


def test_zero_to_fp32_script_safetensors_shards_and_tag(saved, tmp_path):
    from zerolite.checkpoint import get_fp32_state_dict

    save_dir, trained = saved
    proc = _script(save_dir, ".", str(tmp_path / "st"), "--safe_serialization",
                   "--max_shard_size", "20KB")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "st" / "model.safetensors.index.json").is_file()
    from safetensors.torch import load_file

    sd = {}
    for name in sorted(os.listdir(tmp_path / "st")):
        if name.endswith(".safetensors"):
            sd.update(load_file(tmp_path / "st" / name))
    assert len([n for n in os.listdir(tmp_path / "st") if n.endswith(".safetensors")]) > 1
    for name, value in sd.items():  # a tied weight is stored once
        torch.testing.assert_close(value, trained[name], rtol=0, atol=0, msg=name)
    # -t reads another tag (the one saved two steps earlier, not `latest`)
    proc = _script(save_dir, ".", str(tmp_path / "early"), "-t", "early")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    early = torch.load(tmp_path / "early" / "pytorch_model.bin", weights_only=True)
    want = get_fp32_state_dict(str(save_dir), "early")
    assert early.keys() == want.keys() and all(torch.equal(early[k], want[k]) for k in want)
    assert any(not torch.equal(early[k], v) for k, v in trained.items())  # it is the older one


def test_zero_to_fp32_script_bad_input_is_one_line(saved, tmp_path):
    save_dir, _ = saved
    proc = _script(save_dir, ".", str(tmp_path / "x"), "-t", "no_such_tag")
    assert proc.returncode == 1 and proc.stderr.startswith("zero_to_fp32.py: error: "), \
        proc.stderr
    assert "Traceback" not in proc.stderr
    # without zerolite (no site-packages at all here) it says what it needs
    proc = _script(save_dir, ".", str(tmp_path / "y"), python=(sys.executable, "-I", "-S"))
    assert proc.returncode == 1 and "environment where zerolite is installed" in proc.stderr, \
        proc.stderr
