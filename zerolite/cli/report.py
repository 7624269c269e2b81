"""`zerolite report`: what a bug report needs — versions, accelerators, backends, Triton, host."""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import subprocess
import sys

PROBE_TIMEOUT_S = 120


def _version(dist_name: str, module: str | None = None) -> str:
    try:
        mod = importlib.import_module(module or dist_name)
    except Exception as e:  # noqa: BLE001 - a broken install is exactly what a report shows
        return f"not importable ({type(e).__name__}: {e})"
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return f"{version} ({os.path.dirname(getattr(mod, '__file__', '') or '')})"


def _which_deepspeed() -> str:
    """What `import deepspeed` gives this process: none, DeepSpeed, or zerolite's alias."""
    try:
        from zerolite.compat import which_deepspeed

        return which_deepspeed()
    except Exception as e:  # noqa: BLE001 - a broken install is exactly what a report shows
        return f"unknown ({type(e).__name__}: {e})"


def _accelerator() -> list[tuple[str, str]]:
    import torch

    rows = [("cuda available", str(torch.cuda.is_available())),
            ("torch cuda build", str(torch.version.cuda))]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            rows.append((f"cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
                                      f"sm_{props.major}{props.minor}"))
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "current_accelerator"):
        rows.append(("torch.accelerator", str(acc.current_accelerator())))
    return rows


def _backends() -> str:
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed not available"
    names = ("gloo", "nccl", "mpi", "ucc", "xccl")
    found = [n for n in names if getattr(dist, f"is_{n}_available", lambda: False)()]
    return ", ".join(found) or "none"


def _triton(check_kernel: bool) -> list[tuple[str, str]]:
    interp = os.environ.get("TRITON_INTERPRET")
    rows = [("triton", _version("triton")),
            ("TRITON_INTERPRET", repr(interp) if interp is not None else "unset")]
    if not check_kernel:
        return rows + [("triton kernel launch", "skipped (--no-kernel-check)")]
    import torch

    env = dict(os.environ)
    note = ""
    if not torch.cuda.is_available() and interp != "1":
        # Note: without a GPU Triton kernels only run in interpreter mode, which is how the
        # tests run them; probe that mode rather than report a certain failure.
        env["TRITON_INTERPRET"] = "1"
        note = " [no GPU: probed with TRITON_INTERPRET=1]"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        res = subprocess.run([sys.executable, "-m", "zerolite.cli._triton_probe"], env=env,
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        out = (res.stdout.strip() or res.stderr.strip().splitlines()[-1:] or ["no output"])
        text = out if isinstance(out, str) else out[0]
        status = text if res.returncode == 0 else f"FAILED: {text}"
    except subprocess.TimeoutExpired:
        status = f"FAILED: no result after {PROBE_TIMEOUT_S} s"
    return rows + [("triton kernel launch", status + note)]


def _host() -> list[tuple[str, str]]:
    import psutil

    vm = psutil.virtual_memory()
    return [("cpu count", f"{os.cpu_count()} logical, {psutil.cpu_count(logical=False)} physical"),
            ("memory", f"{vm.total / 2**30:.1f} GiB total, {vm.available / 2**30:.1f} GiB "
                       "available")]


def collect(check_kernel: bool = True) -> list[tuple[str, list[tuple[str, str]]]]:
    import torch

    versions = [("python", f"{platform.python_version()} ({sys.executable})"),
                ("platform", platform.platform()),
                ("torch", _version("torch")),
                ("safetensors", _version("safetensors")),
                ("psutil", _version("psutil")),
                ("zerolite", _version("zerolite")),
                ("deepspeed import", _which_deepspeed())]
    threads = [("torch threads", str(torch.get_num_threads()))]
    return [("versions", versions), ("accelerator", _accelerator()),
            ("distributed", [("backends available", _backends())]),
            ("triton", _triton(check_kernel)), ("host", _host() + threads)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="zerolite report", allow_abbrev=False,
                                description="Print the environment for a bug report.")
    p.add_argument("--no-kernel-check", action="store_true",
                   help="do not launch a Triton kernel (saves a few seconds)")
    args = p.parse_args(argv)
    for section, rows in collect(not args.no_kernel_check):
        print(f"[{section}]")
        for key, value in rows:
            print(f"  {key:<22} {value}")
    return 0
