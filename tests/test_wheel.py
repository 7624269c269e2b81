"""The packages as a user gets them: `python -m build` makes an sdist and a wheel from a copy of
the tree, and the wheel, installed into a throwaway venv, gives the `zerolite` command, the
DeepSpeed alias (`zerolite --as-deepspeed` running a DeepSpeed-style script) and the Triton
kernels' package, all from the venv and not from this checkout.

The venv sees the running interpreter's site-packages through a .pth file (torch and the other
dependencies are not downloaded again) and the wheel is installed with --no-deps; a .pth file
does not run the editable install's finder of this checkout, so `zerolite` can only come from
the wheel. About 40 s on 2 cores."""
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from zerolite.version import __version__

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("zerolite", "triton_kernels", "docs", "configs", "setup.cfg", "pyproject.toml",
           "MANIFEST.in", "README.md", "CHANGELOG.md", "mkdocs.yml", "Makefile",
           "constraints-cpu.txt")

SCRIPT = '''
import importlib.metadata as md, os, sys
import torch
import deepspeed                                     # the alias, from the installed wheel
here = os.path.realpath(sys.prefix)
assert os.path.realpath(deepspeed.__file__).startswith(here), deepspeed.__file__
assert md.version("deepspeed") == "0.19.8"
assert md.metadata("deepspeed")["Provides-Alias-Of"] == "zerolite"
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 3}})
for _ in range(3):
    loss = engine(torch.randn(4, 8)).pow(2).mean()
    engine.backward(loss)
    engine.step()
import zerolite, triton_kernels
for mod in (zerolite, triton_kernels):
    assert os.path.realpath(mod.__file__).startswith(here), mod.__file__
q, scale = triton_kernels.quantize_ref(torch.randn(512), bits=8, block_size=256)[:2]
assert md.version("zerolite") == zerolite.__version__
print("ALIAS-OK", engine.global_steps, zerolite.__version__)
'''


def _setuptools_builds_wheels() -> bool:
    """setuptools >= 70.1 has bdist_wheel built in (pyproject.toml asks for no `wheel`)."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


def _run(cmd, cwd, env, timeout=300):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-4000:])
    return r.stdout


def test_wheel_installs_the_command_alias_and_kernels(tmp_path):
    pytest.importorskip("build", reason="python -m build is a test extra (pip install build)")
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    build = [sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist")]
    if _setuptools_builds_wheels():  # offline and fast; else build fetches its own
        build += ["--no-isolation", "--skip-dependency-check"]
    _run([*build, str(src)], tmp_path, env)
    wheel = tmp_path / "dist" / f"zerolite-{__version__}-py3-none-any.whl"
    sdist = tmp_path / "dist" / f"zerolite-{__version__}.tar.gz"
    assert wheel.exists() and sdist.exists(), list((tmp_path / "dist").iterdir())

    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"zerolite-{__version__}.dist-info"
    assert {"zerolite/compat/site/deepspeed/__init__.py",
            "zerolite/compat/site/deepspeed-0.19.8.dist-info/METADATA",
            "triton_kernels/quantize_triton.py", "zerolite/as_deepspeed.py",
            f"{info}/entry_points.txt"} <= names
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert f"Version: {__version__}" in meta
    assert "Classifier: Development Status" in meta and "Requires-Dist: torch" in meta
    assert "zerolite = zerolite.cli:main" in zipfile.ZipFile(wheel).read(
        f"{info}/entry_points.txt").decode()
    in_sdist = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    assert {"CHANGELOG.md", "README.md", "docs/gen/config_reference.py"} <= in_sdist

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   tmp_path, env).strip()
    host = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_host_site_packages.pth").write_text("\n".join(sorted(host)) + "\n")
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
         tmp_path, env)

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    out = _run([str(venv / "bin" / "zerolite"), "--as-deepspeed", "--num_procs", "1",
                "train.py"], work, env)
    assert f"ALIAS-OK 3 {__version__}" in out, out[-2000:]
