"""`make gpu-check` on a machine without CUDA, and the arithmetic its reports rest on."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu_check  # noqa: E402
import gpu_peers  # noqa: E402
import gpu_prefetch  # noqa: E402
import kernel_bandwidth  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA branch")


@no_cuda
@pytest.mark.parametrize("script,says", [("gpu_check.py", "needs a CUDA GPU"),
                                          ("kernel_bandwidth.py", "needs a CUDA device"),
                                          ("gpu_prefetch.py", "needs a CUDA device"),
                                          ("gpu_offload_cpu.py", "needs a CUDA device"),
                                          ("gpu_peers.py", "needs a CUDA device")])
def test_without_cuda_says_so_and_exits_0(tmp_path, script, says):
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, os.path.join("benchmarks", script), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert says in r.stdout
    assert not out.exists()  # nothing half-written


def test_traffic_bytes():
    # int8, 1024 elements, block 256: fp32 in (4096) + codes (1024) + 4 scales (16)
    assert kernel_bandwidth.traffic_bytes("quantize", 1024, 8) == 4096 + 1024 + 16
    assert kernel_bandwidth.traffic_bytes("dequantize", 1024, 4) == 512 + 16 + 4096
    # ragged: 1000 elements still carry 4 full blocks of codes
    assert kernel_bandwidth.traffic_bytes("dequantize", 1000, 8) == 1024 + 16 + 4000
    assert kernel_bandwidth.traffic_bytes("dequantize_sum", 1024, 8, k=8) == 8 * 1040 + 4096
    with pytest.raises(ValueError):
        kernel_bandwidth.traffic_bytes("copy", 1, 8)


def test_spec_bandwidth_from_clock_and_bus():
    class Props:
        memory_clock_rate = 2_619_000  # kHz (an HBM3e part)
        memory_bus_width = 6144  # bits

    assert kernel_bandwidth.spec_bandwidth_gbs(Props()) == pytest.approx(4022.8, rel=1e-4)
    assert kernel_bandwidth.spec_bandwidth_gbs(object()) is None


def test_run_fits_in_nine_minutes_and_the_deadline_cuts_later_phases(tmp_path, monkeypatch):
    # A GPU task has 15 min of device time, machine start included.
    assert gpu_check.DEADLINE_S <= 9 * 60
    names = [name for name, _, _ in gpu_check.phases(str(tmp_path), dry=False)]
    assert names[:2] == ["kernels", "peers"]  # the headline figures first
    ran = []

    def fake_run_phase(name, cmd, limit, out):
        ran.append((name, limit))
        return {"phase": name, "rc": 0, "seconds": 0.0, "log": "-", "tail": ""}

    monkeypatch.setattr(gpu_check, "run_phase", fake_run_phase)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "environment", lambda: {"torch": "x"})
    clock = iter([0.0, 0.0, 100.0, 595.0, 596.0, 597.0, 598.0])
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: next(clock))
    rc = gpu_check.main(["--out", str(tmp_path), "--deadline", "600"])
    assert ran == [("kernels", 45), ("peers", 240)]
    summary = __import__("json").load(open(tmp_path / "summary.json"))
    assert [p["name"] for p in summary["phases"]] == names
    assert summary["phases"][2]["rc"] == "not run: deadline" and rc == 1


def test_only_the_dry_run_gives_its_phases_the_cpu_sizes(tmp_path):
    """On the GPU every phase measures the real sizes; the dry run gives the peers phase its
    tiny CPU model and lists the tests without running them."""
    real = dict((name, cmd) for name, cmd, _ in gpu_check.phases(str(tmp_path), dry=False))
    dry = dict((name, cmd) for name, cmd, _ in gpu_check.phases(str(tmp_path), dry=True))
    assert "--dry-run" not in real["peers"] and "--dry-run" in dry["peers"]
    assert "--collect-only" not in real["tests"] and "--collect-only" in dry["tests"]


def test_phase_timeout_and_failure_are_reported(tmp_path):
    slow = gpu_check.run_phase("slow", [sys.executable, "-c", "import time; time.sleep(30)"],
                               1, str(tmp_path))
    bad = gpu_check.run_phase("bad", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
                              30, str(tmp_path))
    assert slow["rc"] == "timeout" and bad["rc"] == 3 and "boom" in bad["tail"]
    text = gpu_check.write_summary({"torch": "x"}, [slow, bad], str(tmp_path))
    assert "| slow | FAILED (timeout) |" in text and "| bad | FAILED (3) |" in text


def test_exposed_fraction_uses_the_off_run():
    rows = [{"world": 1, "size": "80M", "prefetch": "off", "all_gather_s": 0.2, "exposed_s": 0.2},
            {"world": 1, "size": "80M", "prefetch": "on", "all_gather_s": 0.3, "exposed_s": 0.01}]
    gpu_prefetch.summarize(rows)
    assert rows[0]["exposed_vs_gather_off"] == 1.0
    assert rows[1]["exposed_vs_gather_off"] == pytest.approx(0.05)


def test_dry_run_trains_every_engine_it_can_on_cpu(tmp_path):
    """The peers phase's dry run: a tiny GPT through each engine's own path, the same losses."""
    out = tmp_path / "peers.json"
    r = subprocess.run([sys.executable, "benchmarks/gpu_peers.py", "--dry-run", "--engines",
                        "torch,zerolite,zerolite_offload", "--steps", "3", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["engine"]: row for row in __import__("json").load(open(out))}
    assert set(rows) == {"torch", "zerolite", "zerolite_offload"}
    for row in rows.values():
        assert len(row["losses"]) == 2 + 3 and row["tokens_per_s"] > 0
        # bf16 autocast over fp32 params vs bf16 params over fp32 masters: bf16 noise only
        assert row["max_rel_loss_diff_vs_torch"] < 2e-2


def test_peers_summary_marks_a_failed_engine():
    rows = [{"engine": "torch", "losses": [2.0, 1.0], "tokens_per_s": 10.0, "mfu": 0.1,
             "first_step_s": 1.0},
            {"engine": "zerolite", "losses": [2.0, 1.01], "tokens_per_s": 11.0, "mfu": 0.11,
             "first_step_s": 1.0},
            {"engine": "deepspeed", "error": "rc=1: boom"}]
    gpu_peers.compare(rows)
    assert rows[1]["max_rel_loss_diff_vs_torch"] == pytest.approx(0.01)
    text = gpu_peers.table(rows)
    assert "| deepspeed | FAILED: rc=1: boom" in text and "| zerolite | 11 |" in text


def test_mfu_peak_follows_the_device_name():
    """The lent machines: an H200 and an 'NVIDIA H100 80GB HBM3' (989 TFLOP/s dense bf16
    each); a PCIe H100 has less; an unknown device gets no MFU rather than a wrong one."""
    assert gpu_peers.peak_flops("NVIDIA H200") == gpu_peers.peak_flops(
        "NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_peers.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_peers.peak_flops("cpu") is None
    row = {"engine": "torch", "losses": [1.0], "tokens_per_s": 5.0, "mfu": None,
           "first_step_s": 1.0}
    assert "| torch | 5 | n/a |" in gpu_peers.table([row])


def test_the_tests_phase_runs_every_cuda_test():
    """A cuda-marked test only ever runs in the GPU check's tests phase."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "cuda", "--collect-only", "tests"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    nodes = [line for line in proc.stdout.splitlines() if "::" in line]
    assert nodes, proc.stdout + proc.stderr
    missed = [n for n in nodes
              if not any(n == f or n.startswith(f + "::") or n.startswith(f + "[")
                         for f in gpu_check.TEST_FILES)]
    assert not missed, f"cuda tests the GPU check does not run: {missed}"
