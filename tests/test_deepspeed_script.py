"""A DeepSpeed tutorial-style script (`import zerolite as deepspeed` its only difference)
runs under torchrun on 2 ranks: exit 0, a falling loss, a checkpoint with `latest`."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_deepspeed_style_script_under_torchrun(tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "zero_optimization": {"stage": 3},
    }))
    save_dir = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ZEROLITE_TIMEOUT="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(ROOT, "examples", "deepspeed_style_train.py"), "--deepspeed",
           "--deepspeed_config", str(config), "--save_dir", str(save_dir)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    losses = [float(x) for x in re.findall(r"\] loss: ([0-9.]+)", proc.stdout)]
    assert len(losses) >= 6, output[-4000:]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert (save_dir / "latest").is_file(), sorted(os.listdir(save_dir))
    tag = (save_dir / "latest").read_text().strip()
    assert (save_dir / tag).is_dir()
