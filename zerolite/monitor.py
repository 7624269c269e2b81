"""Training telemetry: a progress line every `steps_per_print` steps, plus CSV / TensorBoard.

    monitor = TrainingMonitor(cfg, rank, world_size)
    ...after every optimizer step, on every rank:
    monitor.on_step(step, {"loss": 2.31, "lr": 3e-4, "grad_norm": 0.9, "samples": 32,
                           "tokens": 32 * 1024, "step_time_s": 0.41})

Logged fields (rank 0; "samples"/"tokens" are what the whole job processed in that step, so the
rates are job-wide): step, loss, lr, grad_norm, samples_per_s, tokens_per_s, step_time_s and,
with wall_clock_breakdown, forward_s/backward_s/step_s — rates and times are averages over the
steps since the previous logged step — and the memory of every rank in MiB (CUDA max allocated
when CUDA is in use, otherwise process RSS).

[Note: one collective, same steps on every rank] Memory per rank needs one all-reduce. Whether a
step is logged depends only on `step % steps_per_print`, which is identical on every rank (the
engine's global step count), never on rank, on data or on whether a sink is enabled, so every
rank enters that all-reduce at the same steps. File I/O happens on rank 0 after the collective;
an I/O error disables that sink with one warning instead of stopping training (or desyncing).
"""
from __future__ import annotations

import csv
import importlib.util
import logging
import os
import time

import torch
import torch.distributed as dist

logger = logging.getLogger("zerolite")

MIB = 1024 ** 2
BASE_FIELDS = ("step", "loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s",
               "step_time_s", "forward_s", "backward_s", "step_s")
_TIMERS = ("forward_s", "backward_s", "step_s")


def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def _enabled(section) -> bool:
    return bool(section) and bool(_get(section, "enabled", False))


def _memory_mib() -> tuple[float, str]:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / MIB, "cuda_max_alloc"
    import psutil

    return psutil.Process().memory_info().rss / MIB, "rss"


class TrainingMonitor:
    """Aggregates per-step metrics; every `config.steps_per_print` steps gathers memory from
    all ranks (one all-reduce) and rank 0 logs a line, appends a CSV row and writes
    TensorBoard scalars (each sink only if enabled in the config)."""

    def __init__(self, config, rank: int, world_size: int):
        self.rank, self.world_size = int(rank), int(world_size)
        self.steps_per_print = max(1, int(_get(config, "steps_per_print", 10) or 10))
        self.fields = BASE_FIELDS + tuple(f"mem_mib_rank{r}" for r in range(self.world_size))
        self._reset_window()
        self.csv_path: str | None = None
        self._tb = None
        self.last_logged: dict | None = None
        """The fields of the last logged step (rank 0), for tests and callers."""
        if self.rank != 0:
            return
        _make_visible()
        csv_cfg = _get(config, "csv_monitor")
        if _enabled(csv_cfg):
            base = os.path.join(_get(csv_cfg, "output_path", "") or "",
                                _get(csv_cfg, "job_name", "") or "zerolite")
            self.csv_path = os.path.join(base, "metrics.csv")
        tb_cfg = _get(config, "tensorboard")
        if _enabled(tb_cfg):
            log_dir = os.path.join(_get(tb_cfg, "output_path", "") or "",
                                   _get(tb_cfg, "job_name", "") or "zerolite")
            self._tb = self._open_tensorboard(log_dir)

    # -- public ----------------------------------------------------------------------------
    def on_step(self, step: int, metrics: dict) -> None:
        """Record one optimizer step; log on the steps that are multiples of steps_per_print.

        Must be called on every rank after every optimizer step with the same `step`.
        """
        w = self._window
        w["steps"] += 1
        w["samples"] += int(metrics.get("samples") or 0)
        tokens = metrics.get("tokens")
        w["tokens"] = None if tokens is None or w["tokens"] is None else w["tokens"] + int(tokens)
        w["time"] += float(metrics.get("step_time_s") or 0.0)
        for key in _TIMERS:
            if metrics.get(key) is not None:
                w[key] = w.get(key, 0.0) + float(metrics[key])
        if step % self.steps_per_print != 0:
            return
        memory, kind = self._gather_memory()
        if self.rank == 0:
            row = self._row(step, metrics, memory)
            self.last_logged = row
            self._log(row, memory, kind)
            self._write_csv(row)
            self._write_tensorboard(row)
        self._reset_window()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    # -- internals -------------------------------------------------------------------------
    def _reset_window(self) -> None:
        self._window: dict = {"steps": 0, "samples": 0, "tokens": 0, "time": 0.0}

    def _gather_memory(self) -> tuple[list[float], str]:
        mine, kind = _memory_mib()
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return [mine], kind
        world, rank = dist.get_world_size(), dist.get_rank()
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else torch.device("cpu"))
        buf = torch.zeros(world, dtype=torch.float64, device=device)
        buf[rank] = mine
        dist.all_reduce(buf)  # each rank fills its own slot: the sum is the gather
        return buf.tolist(), kind

    def _row(self, step: int, metrics: dict, memory: list[float]) -> dict:
        w = self._window
        t = w["time"]
        row = {"step": step, "loss": metrics.get("loss"), "lr": metrics.get("lr"),
               "grad_norm": metrics.get("grad_norm"),
               "samples_per_s": w["samples"] / t if t > 0 else None,
               "tokens_per_s": w["tokens"] / t if t > 0 and w["tokens"] is not None else None,
               "step_time_s": t / w["steps"] if w["steps"] else None}
        for key in _TIMERS:
            row[key] = w[key] / w["steps"] if key in w else None
        for r in range(self.world_size):
            row[f"mem_mib_rank{r}"] = memory[r] if r < len(memory) else None
        return row

    def _log(self, row: dict, memory: list[float], kind: str) -> None:
        parts = [f"step {row['step']}"]
        for key, fmt in (("loss", "loss {:.4f}"), ("lr", "lr {:.3e}"),
                         ("grad_norm", "grad_norm {:.4f}"),
                         ("samples_per_s", "{:.1f} samples/s"), ("tokens_per_s", "{:.0f} tokens/s"),
                         ("step_time_s", "step_time {:.3f}s")):
            if row[key] is not None:
                parts.append(fmt.format(row[key]))
        timers = [f"{k[:-2]} {row[k]:.3f}s" for k in _TIMERS if row[k] is not None]
        if timers:
            parts.append("(" + ", ".join(timers) + ")")
        parts.append(f"{kind} MiB/rank [" + ", ".join(f"{m:.0f}" for m in memory) + "]")
        logger.info("zerolite: " + " | ".join(parts))

    def _write_csv(self, row: dict) -> None:
        if self.csv_path is None:
            return
        try:
            os.makedirs(os.path.dirname(self.csv_path) or ".", exist_ok=True)
            new = not os.path.exists(self.csv_path) or os.path.getsize(self.csv_path) == 0
            if not new:
                with open(self.csv_path, newline="", encoding="utf-8") as f:
                    header = next(csv.reader(f), [])
                if tuple(header) != self.fields:
                    raise OSError(f"{self.csv_path} exists with other columns ({header}); "
                                  "remove it or change csv_monitor.job_name")
            with open(self.csv_path, "a", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=self.fields)
                if new:
                    writer.writeheader()
                writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
        except OSError as e:
            logger.warning("zerolite: csv_monitor disabled: %s", e)
            self.csv_path = None

    def _open_tensorboard(self, log_dir: str):
        if importlib.util.find_spec("tensorboard") is None:
            logger.warning("zerolite: tensorboard.enabled is true but the 'tensorboard' package "
                           "is not installed, so no event files are written; install it with "
                           "`pip install tensorboard`")
            return None
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=log_dir)

    def _write_tensorboard(self, row: dict) -> None:
        if self._tb is None:
            return
        try:
            for key, value in row.items():
                if key != "step" and value is not None:
                    self._tb.add_scalar(f"Train/{key}", value, row["step"])
            self._tb.flush()
        except OSError as e:
            logger.warning("zerolite: tensorboard disabled: %s", e)
            self._tb = None


def _make_visible() -> None:
    """Rank 0 prints progress by default (as DeepSpeed does): if nobody configured logging at all, give
    the "zerolite" logger a stderr handler at INFO instead of letting INFO lines vanish."""
    # Note: only when neither the root nor the zerolite logger has handlers, so an application's
    # (or pytest's) logging set-up is never overridden.
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


class ThroughputTimer:
    """`engine.tput_timer`, DeepSpeed's throughput counters: the engine starts it in forward
    and stops it in step(); programs read its counts and call `update_epoch_count()` at an
    epoch's end (DeepSpeed-Chat does). As in DeepSpeed, time is counted from global step
    `start_step` on, so the warm-up steps do not skew `avg_samples_per_sec()`. It logs
    nothing: TrainingMonitor's progress line is the engine's one report. It reads the host
    clock without synchronizing the device (DeepSpeed synchronizes by default): a timer must
    not stall every micro-step, so on a GPU it counts the time to queue the work."""

    def __init__(self, batch_size: int, start_step: int = 2):
        self.batch_size = batch_size
        self.start_step = start_step
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0
        self.start_time = 0.0
        self.end_time = 0.0
        self.started = False
        self.initialized = False

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        self.initialized = self.started = True
        if self.global_step_count >= self.start_step:
            self.start_time = time.time()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        """End a micro-step (`global_step`: it ended with an optimizer step). `report_speed`
        is accepted for DeepSpeed's signature; the progress line is TrainingMonitor's."""
        if not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time > 0:
            self.end_time = time.time()
            duration = self.end_time - self.start_time
            self.total_elapsed_time += duration
            self.step_elapsed_time += duration
            if global_step:
                self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self) -> float:
        """Samples per second over the timed global steps; -inf until one has been timed."""
        if self.global_step_count == 0:
            return float("-inf")
        timed_steps = self.global_step_count - self.start_step
        if timed_steps <= 0 or self.total_elapsed_time <= 0:
            return float("-inf")
        return self.batch_size / (self.total_elapsed_time / timed_steps)
