"""DeepSpeed's launchers under the alias: `accelerate launch --use_deepspeed` (one node:
torchrun; several nodes: a `deepspeed ...` command line), the `deepspeed` command and
`python -m deepspeed.launcher.runner` / `launch`, each reaching zerolite's launcher; and the
flags they cannot honour refused with one clear line."""
import json
import os
import socket
import subprocess
import sys

import pytest

from zerolite.cli.hostfile import LaunchError
from zerolite.cli.launch import build_parser, launcher_command
from zerolite.compat import BIN_DIR, SITE_DIR
from zerolite.compat.deepspeed.launcher import launch as ds_launch
from zerolite.compat.deepspeed.launcher import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "compat_scripts")
MLP = os.path.join(SCRIPTS, "accelerate_mlp.py")
# accelerate_mlp.py's GAS and CLIP, as launch flags; its model is too small for "auto" sizes.
ACCELERATE_DS = ["launch", "--use_deepspeed", "--zero_stage", "3",
                 "--gradient_accumulation_steps", "2", "--gradient_clipping", "0.5",
                 "--zero3_save_16bit_model", "true"]


def _env() -> dict:
    # The venv's commands (accelerate) on PATH, as in an activated venv.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return dict(os.environ, PYTHONPATH=ROOT, PATH=path, OMP_NUM_THREADS="1",
                ZEROLITE_TIMEOUT="60")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _results(out, world):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _check_trained_by_zerolite(runs):
    from test_compat_accelerate import check_mlp_against_reference

    for r in runs:
        assert r["deepspeed"].startswith(os.path.join(ROOT, "zerolite", "compat")), r
        assert (r["world"], r["zero"]) == (2, [3, 2, 0.5])
    check_mlp_against_reference(runs, 2)


def test_accelerate_launch_one_node_trains_through_zerolite(tmp_path):
    """README's command: `zerolite --as-deepspeed accelerate launch --use_deepspeed ...`."""
    cmd = [sys.executable, "-m", "zerolite.cli", "--as-deepspeed", "accelerate", *ACCELERATE_DS,
           "--num_processes", "2", "--main_process_port", "0", MLP, "--out", str(tmp_path),
           "--from-launcher"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    _check_trained_by_zerolite(_results(tmp_path, 2))


@pytest.mark.slow
def test_accelerate_launch_two_nodes_nossh_trains_through_zerolite(tmp_path):
    """Accelerate's multi-node DeepSpeed launch builds a `deepspeed --hostfile ... --no_ssh
    --node_rank N` command line (the alias's bin/deepspeed, runner.py); two "nodes" of one rank
    each run on this machine, as the same command would on two."""
    (tmp_path / "hosts").write_text("nodeA slots=1\nnodeB slots=1\n")
    port = str(_free_port())
    procs = [subprocess.Popen(
        [sys.executable, "-m", "zerolite.cli", "--as-deepspeed", "accelerate", *ACCELERATE_DS,
         "--num_machines", "2", "--machine_rank", str(r), "--num_processes", "2",
         "--deepspeed_multinode_launcher", "nossh", "--deepspeed_hostfile", "hosts",
         "--main_process_ip", "127.0.0.1", "--main_process_port", port, MLP,
         "--out", str(tmp_path), "--from-launcher"], cwd=tmp_path, env=_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-5000:]
    assert "--node-rank=1" in outputs[1]  # zerolite's torchrun line for the second node
    _check_trained_by_zerolite(_results(tmp_path, 2))


def test_deepspeed_runner_module_starts_ranks_with_the_alias(tmp_path):
    """`python -m deepspeed.launcher.runner` (what the `deepspeed` command runs), one node."""
    from zerolite.compat import alias_env

    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
           os.path.join(SCRIPTS, "imports_only.py"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=alias_env(_env()), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for rank, seen in enumerate(_results(out, 2)):
        assert (seen["rank"], seen["world"], seen["marker"]) == (rank, 2, "zerolite")
        assert seen["local_rank_arg"] == rank  # DeepSpeed's launcher passes --local_rank


def test_deepspeed_command_is_on_the_alias_path():
    from zerolite.compat import alias_env

    env = alias_env(_env())
    assert env["PATH"].split(os.pathsep)[0] == BIN_DIR
    assert env["PYTHONPATH"].split(os.pathsep)[0] == SITE_DIR
    proc = subprocess.run(["deepspeed", "--help"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "usage: deepspeed" in proc.stdout, proc.stdout + proc.stderr


def test_accelerate_reads_the_launcher_constants():
    from zerolite.compat.deepspeed.launcher.constants import PDSH_LAUNCHER

    assert (runner.DEEPSPEED_ENVIRONMENT_NAME, PDSH_LAUNCHER) == (".deepspeed_env", "pdsh")
    assert runner.PDSH_LAUNCHER == PDSH_LAUNCHER


def _runner_argv(*args):
    return runner.zerolite_argv(runner.parse_args(list(args)))


def test_runner_flags_become_zerolite_launch_flags(tmp_path):
    assert _runner_argv("--num_gpus", "2", "t.py", "--x", "1") == \
        ["--as-deepspeed", "--num_gpus", "2", "t.py", "--x", "1"]
    assert _runner_argv("--module", "--no_local_rank", "--master_port", "1234", "pkg.train") \
        == ["--as-deepspeed", "--module", "--no_local_rank", "--master_port", "1234",
            "pkg.train"]
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2\n")
    argv = _runner_argv("--hostfile", str(hosts), "--no_ssh", "--node_rank", "1",
                        "--master_addr", "10.0.0.1", "t.py")
    assert argv == ["--as-deepspeed", "--hostfile", str(hosts), "--master_addr", "10.0.0.1",
                    "--node_rank", "1", "--master_port", "29500", "t.py"]
    args = build_parser().parse_args(argv)
    assert (args.node_rank, args.as_deepspeed, args.hostfile) == (1, True, str(hosts))


@pytest.mark.parametrize("flags, match", [
    (["--launcher", "pdsh"], "logs into no other host.*--no_ssh --node_rank"),
    (["--launcher", "openmpi"], "logs into no other host"),
    (["--no_ssh"], "--no_ssh: each node needs its --node_rank"),
    (["--no_python"], "--no_python: running a non-Python executable"),
    (["--autotuning", "tune"], "--autotuning: the autotuner"),
])
def test_runner_refuses_what_zerolite_cannot_do(tmp_path, flags, match):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=1\nb slots=1\n")
    with pytest.raises(LaunchError, match=match):
        _runner_argv("--hostfile", str(hosts), *flags, "t.py")


def test_per_node_launch_reads_world_info():
    info = ds_launch.encode_world_info({"a": [0, 1], "b": [2, 3]})
    argv, env = ds_launch.zerolite_argv(ds_launch.parse_args(
        [f"--world_info={info}", "--node_rank=1", "--master_addr=10.0.0.1",
         "--master_port=2000", "t.py", "--x"]))
    assert argv == ["--as-deepspeed", "--num_procs", "2", "--num_nodes", "2", "--node_rank",
                    "1", "--master_addr", "10.0.0.1", "--master_port", "2000", "t.py", "--x"]
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(LaunchError, match="--node_rank 2: --world_info has 2 node"):
        ds_launch.zerolite_argv(ds_launch.parse_args([f"--world_info={info}",
                                                      "--node_rank=2", "t.py"]))
    with pytest.raises(LaunchError, match="--world_info"):
        ds_launch.zerolite_argv(ds_launch.parse_args(["--world_info=e30=", "t.py"]))


def test_as_deepspeed_runs_a_launcher_command_with_the_alias(monkeypatch):
    monkeypatch.setenv("PATH", _env()["PATH"])
    got = launcher_command(build_parser().parse_args(["--as-deepspeed", "accelerate", "launch",
                                                      "--num_processes", "2", "t.py"]))
    assert got["cmd"][0].endswith("accelerate") and got["cmd"][1:] == \
        ["launch", "--num_processes", "2", "t.py"]
    assert got["env"]["PYTHONPATH"].split(os.pathsep)[0] == SITE_DIR
    with pytest.raises(LaunchError, match="--num_procs: .*the command starts the processes"):
        launcher_command(build_parser().parse_args(["--as-deepspeed", "--num_procs", "2",
                                                    "accelerate", "launch", "t.py"]))
    with pytest.raises(LaunchError, match="'no-such-thing': no such script, nor a command"):
        launcher_command(build_parser().parse_args(["--as-deepspeed", "no-such-thing"]))
    # a script is not a command; without --as-deepspeed nothing changes
    assert launcher_command(build_parser().parse_args(["--as-deepspeed", MLP])) is None
    assert launcher_command(build_parser().parse_args(["accelerate"])) is None
