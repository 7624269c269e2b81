"""The `zerolite` command: launcher dry runs, hostfile errors, check-config numbers, report."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from zerolite.cli.check_config import estimate_model_state_bytes
from zerolite.cli.launch import LaunchError, build_parser, parse_hostfile, plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, cwd=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "zerolite.cli", *map(str, args)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_main(argv):
    """The CLI in this process (for variants of what the subprocess tests already cover)."""
    from zerolite.cli import main

    return main(list(map(str, argv)))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


HOSTS = """# two nodes
worker-0 slots=4   # first

worker-1 slots=4
"""


def plan_of(argv, gpus=0, names=("worker-1",)):
    return plan(build_parser().parse_args([*argv, "train.py", "--lr", "1"]), gpus=gpus,
                local_names=set(names))


# -- launcher: dry runs --------------------------------------------------------------------
def test_dry_run_single_node_cpu_prints_torchrun_command():
    r = cli("--num_procs", "3", "--dry-run", "train.py", "--foo", "1")
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.strip().splitlines()[-1]
    assert "-m torch.distributed.run --nnodes=1 --nproc-per-node=3 --standalone" in cmd
    assert cmd.endswith("--max-restarts=0 train.py --foo 1")
    # `launch` as an explicit subcommand gives the same command (in-process: faster).
    assert run_main(["launch", "--num_procs", "3", "--dry-run", "train.py", "--foo", "1"]) == 0


def test_dry_run_hostfile_derives_node_rank_from_hostname(tmp_path):
    me = socket.gethostname()
    hostfile = write(tmp_path, "hosts", f"other-host slots=2\n{me} slots=2\n")
    r = cli("--hostfile", hostfile, "--master_port", 29555, "--max_restarts", 2, "--dry-run",
            "train.py")
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.strip().splitlines()[-1]
    for part in ("--nnodes=2", "--nproc-per-node=2", "--node-rank=1",
                 "--master-addr=other-host", "--master-port=29555", "--max-restarts=2"):
        assert part in cmd
    assert "run this same zerolite command on every node" in r.stdout


def test_dry_run_include_exclude_subprocess(tmp_path):
    hostfile = write(tmp_path, "hosts", HOSTS)
    r = cli("-H", hostfile, "--include", "worker-0:0,1@worker-1:2,3", "--node_rank", 1,
            "--dry-run", "train.py")
    assert r.returncode == 0, r.stderr
    assert "--nnodes=2 --nproc-per-node=2 --node-rank=1 --master-addr=worker-0" in r.stdout

def test_dry_run_exclude_in_process(tmp_path, capsys):
    hostfile = write(tmp_path, "hosts", HOSTS)
    assert run_main(["-H", hostfile, "--exclude", "worker-1", "--dry-run", "train.py"]) == 0
    assert "--nnodes=1 --nproc-per-node=4 --standalone" in capsys.readouterr().out


@pytest.mark.parametrize("argv, nnodes, nproc, node_rank, visible", [
    (["--hostfile", "H"], 2, 4, 1, None),
    (["--hostfile", "H", "--num_nodes", "1"], 1, 4, 0, None),
    (["--hostfile", "H", "--num_gpus", "2", "--node_rank", "0"], 2, 2, 0, None),
    (["--hostfile", "H", "--include", "worker-1:1,3"], 1, 2, 0, "1,3"),
    (["--hostfile", "H", "--include", "worker-0@worker-1"], 2, 4, 1, None),
    (["--hostfile", "H", "--exclude", "worker-0:0@worker-1:3"], 2, 3, 1, None),
    (["--hostfile", "H", "--exclude", "worker-0:0@worker-1:3", "--node_rank", "0"], 2, 3, 0,
     "1,2,3"),
    (["--hostfile", "H", "--exclude", "worker-0"], 1, 4, 0, None),
    (["--num_gpus", "2"], 1, 2, 0, None),
    (["--include", "localhost:1"], 1, 1, 0, "1"),
])
def test_plan_combinations(tmp_path, argv, nnodes, nproc, node_rank, visible):
    hostfile = write(tmp_path, "hosts", HOSTS)
    argv = [hostfile if a == "H" else a for a in argv]
    p = plan_of(argv, gpus=4)
    assert (p["nnodes"], p["nproc"], p["node_rank"]) == (nnodes, nproc, node_rank)
    assert p["env"].get("CUDA_VISIBLE_DEVICES") == visible
    assert f"--nproc-per-node={nproc}" in p["cmd"] and p["cmd"][-3:] == ["train.py", "--lr", "1"]
    if nnodes > 1:
        assert f"--node-rank={node_rank}" in p["cmd"]
        assert "--master-addr=worker-0" in p["cmd"] and "--master-port=29500" in p["cmd"]


def test_plan_multinode_without_hostfile_and_cpu_defaults():
    p = plan_of(["--num_nodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
                 "--num_procs", "2"])
    assert p["nnodes"] == 2 and p["nproc"] == 2
    assert "--master-addr=10.0.0.1" in p["cmd"] and "--node-rank=1" in p["cmd"]
    p = plan_of([])  # no GPUs, no flags: one CPU rank
    assert p["nproc"] == 1 and "--standalone" in p["cmd"] and p["env"] == {}


# -- launcher: errors ----------------------------------------------------------------------
@pytest.mark.parametrize("text, needle", [
    ("worker-0 slots=4\nworker-1 slot=4\n", ":2: 'worker-1 slot=4': expected 'hostname slots=N'"),
    ("worker-0\n", ":1: 'worker-0': expected 'hostname slots=N'"),
    ("worker-0 slots=x\n", ":1: 'worker-0 slots=x': slots must be a positive integer"),
    ("worker-0 slots=0\n", "slots must be a positive integer"),
    ("a slots=1\na slots=2\n", ":2: 'a slots=2': host 'a' is listed twice"),
    ("# only a comment\n\n", "no 'hostname slots=N' lines found"),
])
def test_bad_hostfile_lines(tmp_path, text, needle):
    with pytest.raises(LaunchError, match=None) as info:
        parse_hostfile(text, "hosts")
    assert needle in str(info.value)


def test_bad_hostfile_exits_2_with_one_line(tmp_path, capsys):
    hostfile = write(tmp_path, "hosts", "worker-0 slots=2\nworker-1 slots two\n")
    r = cli("--hostfile", hostfile, "--dry-run", "train.py")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{hostfile}:2:" in lines[0] and "slots two" in lines[0]
    assert run_main(["--hostfile", tmp_path / "missing", "--dry-run", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "--hostfile" in err and "cannot read" in err


@pytest.mark.parametrize("argv, needle", [
    (["--include", "worker-9"], "host 'worker-9' is not in the hostfile"),
    (["--include", "worker-0:7"], "host 'worker-0' has no slot 7"),
    (["--include", "worker-0:a"], "slot 'a' of host 'worker-0'"),
    (["--include", "@worker-0"], "empty host name"),
    (["--include", "worker-0:0,0"], "slot 0 of host 'worker-0' appears twice"),
    (["--include", "worker-0", "--exclude", "worker-1"], "--include and --exclude"),
    (["--include", "worker-0", "--num_gpus", "2"], "cannot be combined with --num_nodes"),
    (["--exclude", "worker-0@worker-1"], "excludes every host"),
    (["--include", "worker-0:0@worker-1"], "different slot counts"),
    (["--num_gpus", "2", "--num_procs", "3"], "--num_gpus 2 and --num_procs 3 disagree"),
    (["--num_procs", "0"], "--num_procs 0"),
    (["--num_nodes", "3"], "--num_nodes 3: the hostfile has only 2"),
    (["--num_gpus", "8"], "host 'worker-0' has only 4 slot(s)"),
    (["--node_rank", "5"], "--node_rank 5: must be < the number of nodes (2)"),
])
def test_bad_flags(tmp_path, argv, needle):
    hostfile = write(tmp_path, "hosts", HOSTS)
    with pytest.raises(LaunchError) as info:
        plan_of(["--hostfile", hostfile, *argv], gpus=4)
    assert needle in str(info.value)


def test_unknown_node_and_multinode_without_hostfile_errors(tmp_path):
    hostfile = write(tmp_path, "hosts", HOSTS)
    with pytest.raises(LaunchError, match="not among the hosts.*pass --node_rank"):
        plan_of(["--hostfile", hostfile], names=("laptop",))
    with pytest.raises(LaunchError, match="needs --master_addr and --node_rank"):
        plan_of(["--num_nodes", "2"])


def test_bad_include_exits_2_via_cli(tmp_path):
    hostfile = write(tmp_path, "hosts", HOSTS)
    r = cli("--hostfile", hostfile, "--include", "worker-0:9", "--dry-run", "train.py")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "zerolite: error: --include 'worker-0:9': host 'worker-0' has no slot 9 (slots 0-3)"]


# -- check-config --------------------------------------------------------------------------
@pytest.mark.parametrize("precision, formulas", [
    ("bf16", ["18Ψ", "4Ψ + 14Ψ/N", "2Ψ + 18Ψ/N", "18Ψ/N"]),
    ("fp32", ["20Ψ", "8Ψ + 12Ψ/N", "4Ψ + 16Ψ/N", "16Ψ/N"]),
])
def test_estimator_formulas(precision, formulas):
    # the byte counts themselves are checked against memory_stats() in test_memory_estimate.py
    assert [estimate_model_state_bytes(10, 2, s, precision)["formula"] for s in range(4)] \
        == formulas


def test_estimator_rejects_bad_input():
    with pytest.raises(ValueError, match="stage"):
        estimate_model_state_bytes(10, 2, 4, "bf16")
    with pytest.raises(ValueError, match="precision"):
        estimate_model_state_bytes(10, 2, 3, "int8")


MODEL_FILE = """
import torch.nn as nn
from zerolite.models import GPT, GPTConfig

def tiny():
    return GPT(GPTConfig(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=32))

def untied():
    return GPT(GPTConfig(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=32,
                         tie_embeddings=False))

def mlp():
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
"""


@pytest.mark.parametrize("factory, world, config", [("tiny", 2, "zero3_bf16.json"),
                                                    ("untied", 4, "zero3_cpu.json"),
                                                    ("mlp", 3, "zero3_bf16.json")])
def test_check_config_model_numbers(tmp_path, factory, world, config):
    import importlib

    write(tmp_path, "my_models.py", MODEL_FILE)
    r = cli("check-config", os.path.join(ROOT, "configs", config), "--world-size", world,
            "--model", f"my_models:{factory}", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    sys.path.insert(0, str(tmp_path))
    try:
        model = getattr(importlib.import_module("my_models"), factory)()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_models", None)
    p = sum(t.numel() for t in {id(t): t for t in model.parameters()}.values())
    assert out["num_params"] == p
    if factory == "tiny":  # tied lm_head counted once
        assert p == sum(t.numel() for n, t in model.named_parameters() if n != "lm_head.weight")
    precision = out["precision"]
    assert precision == ("bf16" if config == "zero3_bf16.json" else "fp32")
    for stage, e in out["memory"]["per_stage"].items():
        assert e == pytest.approx(estimate_model_state_bytes(p, world, int(stage), precision))
    b = out["batch"]
    assert b["train_batch_size"] == (b["train_micro_batch_size_per_gpu"]
                                     * b["gradient_accumulation_steps"] * world)
    assert out["memory"]["stage3_gathered_bytes"] > 0


def test_check_config_text_output():
    r = cli("check-config", os.path.join(ROOT, "configs", "zero3_bf16.json"), "--world-size", 4,
            "--params", "1.3e9")
    assert r.returncode == 0, r.stderr
    assert "train_batch_size 16 = micro batch 4 x gradient_accumulation_steps 1 x world_size 4" \
        in r.stdout
    assert '"stage": 3' in r.stdout  # resolved config
    assert "18Ψ/N" in r.stdout and "4Ψ + 14Ψ/N" in r.stdout  # bf16: stage 1 sums in bf16
    assert "activations" in r.stdout and "not included" in r.stdout
    gib = 18 * 1.3e9 / 4 / 2**30
    assert f"{gib:.3f} GiB <-" in r.stdout


@pytest.mark.parametrize("cfg, needle", [
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, "not divisible"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 7}},
     "zero_optimization.stage"),
])
def test_check_config_bad_config_exits_2(tmp_path, capsys, cfg, needle):
    path = write(tmp_path, "ds.json", json.dumps(cfg))
    assert run_main(["check-config", path, "--world-size", 2]) == 2
    out = capsys.readouterr()
    assert needle in out.err and "error:" in out.err and out.out == ""


def test_check_config_bad_json_and_bad_model(tmp_path, capsys):
    path = write(tmp_path, "ds.json", '{"train_batch_size": [8}')  # invalid as JSON and Hjson
    r = cli("check-config", path, "--world-size", 2)
    assert r.returncode == 2 and "invalid JSON" in r.stderr and "line 1" in r.stderr
    good = os.path.join(ROOT, "configs", "zero3_cpu.json")
    assert run_main(["check-config", good, "--world-size", 2, "--model", "no_such_module:f"]) == 2
    assert "no_such_module" in capsys.readouterr().err


# -- report / help / consolidate -----------------------------------------------------------
def test_report_lists_versions():
    import torch

    r = cli("report", "--no-kernel-check")
    assert r.returncode == 0, r.stderr
    assert f"torch                  {torch.__version__}" in r.stdout
    for needle in ("python", "safetensors", "psutil", "zerolite", "triton", "cuda available",
                   "backends available", "gloo", "TRITON_INTERPRET", "cpu count", "memory"):
        assert needle in r.stdout


def test_help_and_consolidate_delegation(monkeypatch):
    from zerolite import cli as cli_pkg

    assert cli_pkg.main(["--help"]) == 0
    calls = []
    fake = SimpleNamespace(main=lambda argv: calls.append(argv) or 0)
    monkeypatch.setitem(sys.modules, "zerolite.checkpoint.consolidate", fake)
    assert cli_pkg.main(["consolidate", "in", "out"]) == 0
    assert calls == [["in", "out"]]


def test_launcher_exit_now_flushes_and_keeps_the_code():
    """launch.exit_now (the `zerolite` command's end once its job is over, skipping the
    interpreter's seconds-long finalization after `import torch`): buffered output still
    arrives and the job's exit code is the process's."""
    code = ("import sys, torch; from zerolite.cli.launch import exit_now; "
            "sys.stdout.write('buffered out'); sys.stderr.write('buffered err'); exit_now(7)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, "buffered out", "buffered err")
