"""TrainingMonitor: log line, CSV rows (one per logged step), TensorBoard fallback, 1 and 2 ranks."""
from __future__ import annotations

import csv
import importlib.util
import logging

import pytest

from zerolite.config import load_config
from zerolite.monitor import BASE_FIELDS, TrainingMonitor
from zerolite.testing.multiprocess import run_ranks


def make_config(tmp_path, world_size, steps_per_print=2, **extra):
    raw = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": steps_per_print,
           "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "job"}}
    raw.update(extra)
    return load_config(raw, world_size)


def metrics(step, **extra):
    m = {"loss": 1.0 / step, "lr": 1e-3 * step, "grad_norm": 0.5, "samples": 8,
         "tokens": 8 * 16, "step_time_s": 0.25}
    m.update(extra)
    return m


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_single_process_csv_and_log(tmp_path, caplog):
    cfg = make_config(tmp_path, 1)
    mon = TrainingMonitor(cfg, rank=0, world_size=1)
    with caplog.at_level(logging.INFO, logger="zerolite"):
        for step in range(1, 8):
            mon.on_step(step, metrics(step))
    rows = read_rows(tmp_path / "job" / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    with open(tmp_path / "job" / "metrics.csv") as f:
        assert f.readline().strip().split(",") == [*BASE_FIELDS, "mem_mib_rank0"]
    last = rows[-1]
    assert float(last["loss"]) == pytest.approx(1 / 6)
    assert float(last["lr"]) == pytest.approx(6e-3)
    assert float(last["samples_per_s"]) == pytest.approx(8 / 0.25)
    assert float(last["tokens_per_s"]) == pytest.approx(8 * 16 / 0.25)
    assert float(last["step_time_s"]) == pytest.approx(0.25)
    assert last["forward_s"] == ""  # no wall_clock_breakdown timers given
    assert float(last["mem_mib_rank0"]) > 10  # RSS of a process with torch loaded
    lines = [r.getMessage() for r in caplog.records if "step 6" in r.getMessage()]
    assert len(lines) == 1
    for needle in ("loss 0.1667", "lr 6.000e-03", "grad_norm 0.5000", "32.0 samples/s",
                   "512 tokens/s", "step_time 0.250s", "rss MiB/rank ["):
        assert needle in lines[0]

    # A second run appends rows under the same header (header written once).
    mon2 = TrainingMonitor(cfg, rank=0, world_size=1)
    mon2.on_step(2, metrics(2, loss=None, tokens=None, forward_s=0.1, backward_s=0.2, step_s=0.05))
    with open(tmp_path / "job" / "metrics.csv") as f:
        text = f.read()
    assert text.count("step,loss") == 1
    row = read_rows(tmp_path / "job" / "metrics.csv")[-1]
    assert row["loss"] == "" and row["tokens_per_s"] == ""
    assert float(row["backward_s"]) == pytest.approx(0.2)


def test_rates_average_over_the_window(tmp_path):
    mon = TrainingMonitor(make_config(tmp_path, 1, steps_per_print=3), rank=0, world_size=1)
    for step, t in zip(range(1, 4), (0.1, 0.2, 0.3)):
        mon.on_step(step, metrics(step, step_time_s=t, tokens=None))
    row = mon.last_logged
    assert row["samples_per_s"] == pytest.approx(24 / 0.6)
    assert row["step_time_s"] == pytest.approx(0.2)
    assert row["tokens_per_s"] is None


def test_tensorboard_enabled(tmp_path, caplog):
    cfg = make_config(tmp_path, 1, tensorboard={"enabled": True, "output_path": str(tmp_path),
                                                "job_name": "tb"})
    with caplog.at_level(logging.WARNING, logger="zerolite"):
        mon = TrainingMonitor(cfg, rank=0, world_size=1)
        mon.on_step(2, metrics(2))
        mon.close()
    if importlib.util.find_spec("tensorboard") is None:
        warnings = [r.getMessage() for r in caplog.records if "tensorboard" in r.getMessage()]
        assert len(warnings) == 1 and "pip install tensorboard" in warnings[0]
    else:
        assert any(p.name.startswith("events.out") for p in (tmp_path / "tb").iterdir())


def test_disabled_sinks_write_nothing(tmp_path):
    cfg = load_config({"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1,
                       "csv_monitor": {"enabled": False, "output_path": str(tmp_path)}}, 1)
    mon = TrainingMonitor(cfg, rank=0, world_size=1)
    mon.on_step(1, metrics(1))
    assert mon.csv_path is None and list(tmp_path.iterdir()) == []
    assert mon.last_logged["step"] == 1


def _two_rank_body(rank, world_size, tmp_path):
    cfg = make_config(tmp_path, world_size)
    mon = TrainingMonitor(cfg, rank=rank, world_size=world_size)
    for step in range(1, 6):
        # Ranks report different step times: only rank 0's window is logged.
        mon.on_step(step, metrics(step, step_time_s=0.5 if rank == 0 else 9.0))
    return mon.last_logged


def test_two_ranks_one_row_per_logged_step(tmp_path):
    results = run_ranks(_two_rank_body, 2, tmp_path, timeout_s=60, comm_timeout_s=20)
    assert results[1] is None  # only rank 0 logs
    rows = read_rows(tmp_path / "job" / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [2, 4]
    for r in rows:
        assert float(r["mem_mib_rank0"]) > 10 and float(r["mem_mib_rank1"]) > 10
        assert float(r["samples_per_s"]) == pytest.approx(16.0)
    assert results[0]["step"] == 4
