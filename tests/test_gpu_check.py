"""`make gpu-check` on a machine without CUDA, and the arithmetic its reports rest on."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu_check  # noqa: E402
import gpu_prefetch  # noqa: E402
import kernel_bandwidth  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA branch")


@no_cuda
@pytest.mark.parametrize("script,says", [("gpu_check.py", "needs a CUDA GPU"),
                                          ("kernel_bandwidth.py", "needs a CUDA device"),
                                          ("gpu_prefetch.py", "needs a CUDA device"),
                                          ("gpu_offload_cpu.py", "needs a CUDA device")])
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


def test_phases_fit_in_nine_minutes():
    # 8.5 min since the offload phase (issue 15): a GPU task has 15 min of device time,
    # machine start included.
    assert sum(limit for _, _, limit in gpu_check.phases("/tmp/x")) <= 9 * 60


def test_phase_timeout_and_failure_are_reported(tmp_path):
    slow = gpu_check.run_phase("slow", [sys.executable, "-c", "import time; time.sleep(30)"],
                               1, str(tmp_path))
    bad = gpu_check.run_phase("bad", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
                              30, str(tmp_path))
    assert slow["rc"] == "timeout" and bad["rc"] == 3 and "boom" in bad["tail"]
    text = gpu_check.summary({"torch": "x"}, [slow, bad], str(tmp_path))
    assert "| slow | FAILED (timeout) |" in text and "| bad | FAILED (3) |" in text


def test_exposed_fraction_uses_the_off_run():
    rows = [{"world": 1, "size": "80M", "prefetch": "off", "all_gather_s": 0.2, "exposed_s": 0.2},
            {"world": 1, "size": "80M", "prefetch": "on", "all_gather_s": 0.3, "exposed_s": 0.01}]
    gpu_prefetch.summarize(rows)
    assert rows[0]["exposed_vs_gather_off"] == 1.0
    assert rows[1]["exposed_vs_gather_off"] == pytest.approx(0.05)
