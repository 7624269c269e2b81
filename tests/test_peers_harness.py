"""benchmarks.peers at the tiny size, world 2: every engine runs in its own torchrun job, the
JSON has every field, and the losses agree with each other and with the single-process
reference within fp32 noise (every engine clips with a float64 norm)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("engine", "size", "dtype", "world", "params", "global_batch", "micro_batch",
          "median_step_s", "samples_per_s", "step_times_s", "peak_rss_mib",
          "peak_rss_mib_per_rank", "exposed_comm_s", "losses", "max_abs_dloss",
          "max_rel_dloss", "time_vs_ddp", "mem_vs_ddp", "time_vs_zerolite3",
          "mem_vs_zerolite3", "status")
STEPS, WARMUP = 3, 1


def _run(tmp_path, engines, timeout=180, site=None):
    """`site`: a folder with real DeepSpeed in it (.ds-site), put on the path after the repo."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [str(REPO), site, os.environ.get("PYTHONPATH")] if p))
    cmd = [sys.executable, "-m", "benchmarks.peers.run", "--sizes", "tiny", "--worlds", "2",
           "--dtypes", "fp32", "--engines", ",".join(engines), "--steps", str(STEPS),
           "--warmup", str(WARMUP), "--out-dir", str(tmp_path), "--timeout", str(timeout)]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=timeout * (len(engines) + 1))
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"peers.{ext}").stat().st_size > 0
    assert (tmp_path / "peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((tmp_path / "peers.json").read_text())


def _check(report, engines):
    assert {"cpu", "cores", "torch"} <= set(report["machine"])
    ref = report["references"]["tiny/fp32"]["losses"]
    assert len(ref) == STEPS + WARMUP
    runs = {r["engine"]: r for r in report["results"]}
    assert set(runs) == set(engines)
    for name, r in runs.items():
        assert r["status"] == "ok", r
        missing = [f for f in FIELDS if f not in r]
        assert not missing, (name, missing)
        assert len(r["losses"]) == STEPS + WARMUP and len(r["step_times_s"]) == STEPS
        assert r["median_step_s"] > 0 and r["peak_rss_mib"] > 0
        assert r["max_rel_dloss"] < 1e-4, (name, r["losses"], ref)
    first = runs[engines[0]]["losses"]
    for r in runs.values():
        for a, b in zip(r["losses"], first):
            assert abs(a - b) <= 1e-4 * abs(b), (r["engine"], r["losses"], first)
    return runs


def test_peers_tiny_world2(tmp_path):
    engines = ["zerolite3", "fsdp2", "ddp"]
    runs = _check(_run(tmp_path, engines), engines)
    assert runs["zerolite3"]["exposed_comm_s"] is not None  # from zerolite's StepStats
    assert runs["ddp"]["exposed_comm_s"] is None  # "n/a"
    # Bytes counted at torch.distributed agree with zerolite's own accounting (plus the
    # float64 grad-norm all-reduce: 8 bytes); DDP's are computed: one all-reduce of all grads.
    zl = runs["zerolite3"]
    assert 0 <= zl["bytes_sent_per_step"] - zl["comm"]["own_bytes_sent"] <= 64, zl
    assert zl["comm"]["own_bytes_sent"] > 0
    grads = runs["ddp"]["params"] * 4
    assert runs["ddp"]["bytes_sent_per_step"] == grads  # 2 (N-1)/N = 1 at world 2
    md = (tmp_path / "peers.md").read_text()
    assert "| zerolite3 | tiny | fp32 | 2 |" in md and "cores" in md


@pytest.mark.deepspeed
def test_peers_tiny_world2_deepspeed(tmp_path):
    """The benchmark's DeepSpeed engine, real DeepSpeed 0.19.8 from .ds-site (`make
    ds-clients` installs it and runs this), beside zerolite: the same losses."""
    site = os.path.abspath(os.environ.get("ZEROLITE_DS_SITE", REPO / ".ds-site"))
    if not os.path.isdir(os.path.join(site, "deepspeed")):
        pytest.fail(f"DeepSpeed 0.19.8 is not installed in {site}: run `make ds-clients`")
    engines = ["deepspeed", "zerolite3"]
    _check(_run(tmp_path, engines, timeout=600, site=site), engines)
