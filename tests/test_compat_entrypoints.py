"""Unchanged DeepSpeed import lines run on zerolite through both entry points
(`zerolite --as-deepspeed`, `torchrun -m zerolite.as_deepspeed`) at world 2, with no
DeepSpeed installed and with one installed (a fake `deepspeed` dist on PYTHONPATH stands in
for site-packages: the alias must win there, and only in processes started as DeepSpeed)."""
import json
import os
import subprocess
import sys

import pytest

from zerolite.compat import DEEPSPEED_API_VERSION, SITE_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "compat_scripts", "imports_only.py")


def _fake_installed_deepspeed(root) -> str:
    site = root / "site-packages"
    (site / "deepspeed").mkdir(parents=True)
    (site / "deepspeed" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    info = site / "deepspeed-0.0.1.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\n"
                                         "Version: 0.0.1\n")
    return str(site)


def _env(extra_path: str | None) -> dict:
    path = [ROOT] + ([extra_path] if extra_path else [])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1",
                ZEROLITE_TIMEOUT="60", HF_HUB_OFFLINE="1")


def _run(cmd, env, tmp_path):
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]


LAUNCHER, TORCHRUN = "zerolite --as-deepspeed", "torchrun -m zerolite.as_deepspeed"
SLOW = pytest.mark.slow  # the other two pairings: same code paths, ~25 s each under load


@pytest.mark.parametrize("entry, installed", [
    (LAUNCHER, False), (TORCHRUN, True),
    pytest.param(LAUNCHER, True, marks=SLOW), pytest.param(TORCHRUN, False, marks=SLOW),
], ids=["launcher-deepspeed-absent", "torchrun-deepspeed-present",
        "launcher-deepspeed-present", "torchrun-deepspeed-absent"])
def test_deepspeed_imports_resolve_to_zerolite(entry, installed, tmp_path):
    (tmp_path / "out").mkdir()
    env = _env(_fake_installed_deepspeed(tmp_path) if installed else None)
    if entry.startswith("zerolite"):
        cmd = [sys.executable, "-m", "zerolite.cli", "--as-deepspeed", "--num_gpus", "2",
               SCRIPT, "--out", str(tmp_path / "out")]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "zerolite.as_deepspeed", SCRIPT,
               "--out", str(tmp_path / "out")]
    seen = _run(cmd, env, tmp_path)
    for rank, s in enumerate(seen):
        assert (s["rank"], s["world"], s["sum"]) == (rank, 2, 3.0)
        assert s["version"] == s["dist_version"] == DEEPSPEED_API_VERSION
        assert s["marker"] == "zerolite"
        assert s["file"].startswith(os.path.join(ROOT, "zerolite", "compat")), s["file"]
        assert s["pythonpath"].split(os.pathsep)[0] == SITE_DIR
        assert (s["device_name"], s["backend"]) == ("cpu", "gloo")
        # DeepSpeed's launcher passes --local_rank; torchrun does not
        want = rank if entry.startswith("zerolite") else -1
        assert s["local_rank_arg"] == want and s["env_local_rank"] == rank
    assert seen[0]["worker"] == f"{DEEPSPEED_API_VERSION}|zerolite|{DEEPSPEED_API_VERSION}"


def test_alias_is_off_where_not_asked_for(tmp_path):
    probe = ("import importlib.util, importlib.metadata as m; s = importlib.util.find_spec("
             "'deepspeed'); print(s.origin if s else None, m.version('deepspeed') if s else None)")
    absent = subprocess.run([sys.executable, "-c", probe], env=_env(None), capture_output=True,
                            text=True, timeout=60)
    assert absent.stdout.split() == ["None", "None"], absent.stdout + absent.stderr
    fake = _fake_installed_deepspeed(tmp_path)
    present = subprocess.run([sys.executable, "-c", probe], env=_env(fake),
                             capture_output=True, text=True, timeout=60)
    assert present.stdout.split() == [os.path.join(fake, "deepspeed", "__init__.py"), "0.0.1"]


def test_report_says_which_deepspeed(tmp_path):
    fake = _fake_installed_deepspeed(tmp_path)
    cmd = [sys.executable, "-m", "zerolite.cli", "report", "--no-kernel-check"]
    plain = subprocess.run(cmd, env=_env(fake), capture_output=True, text=True, timeout=120)
    aliased = subprocess.run([sys.executable, "-m", "zerolite.as_deepspeed", "-m", *cmd[2:]],
                             env=_env(fake), capture_output=True, text=True, timeout=120)
    line = [ln for ln in plain.stdout.splitlines() if "deepspeed import" in ln]
    assert line and "DeepSpeed 0.0.1" in line[0] and "alias" not in line[0], plain.stdout
    line = [ln for ln in aliased.stdout.splitlines() if "deepspeed import" in ln]
    assert line and f"zerolite's DeepSpeed alias {DEEPSPEED_API_VERSION}" in line[0], \
        aliased.stdout + aliased.stderr
