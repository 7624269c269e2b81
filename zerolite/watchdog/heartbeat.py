"""The watchdog thread: heartbeats through the rendezvous TCPStore, verdicts, fast exit.

Each rank runs one daemon thread. Every `interval_s` it publishes its `Beat` (progress
counter sampled from zerolite.comm.last_collective, idle time, last collective) under
`<prefix>beat/<rank>`, and reads `<prefix>verdict`. Monitor ranks (0 and 1) also read every
rank's beat and judge them (judge.py); the first verdict is written with compare_set, so all
ranks report the same one. On a verdict every live rank writes ONE line to stderr and leaves
with os._exit(1): no atexit handler, no lingering non-daemon thread and no collective stuck
in C++ can keep it alive. A stopped rank cannot exit by itself; the zerolite launcher is
told (SIGUSR1 to ZEROLITE_LAUNCHER_PID) and SIGKILLs what is left.

[Note: out of band] The thread uses its own client of the default process group's store (a
clone: its own connection), never the process group's collectives: the process group is what
is stuck when the watchdog is needed, and a second client keeps the thread off the store socket
the main thread may be blocked on. The group's own store works for every init method (env://,
tcp://, file://, a store passed in): the watchdog needs no address of its own.
[Note: joined at exit] A store call releases the GIL inside torch's C++ (pybind11's
gil_scoped_release). If the interpreter finalizes while this daemon thread is in one, the
thread calls pthread_exit when it takes the GIL back, the forced unwind meets the noexcept
destructor of gil_scoped_release and std::terminate aborts the process ("terminate called
without an active exception", exit -6) after the script has finished: issue 24, seen in a
core dump in multi_get of `_judge_all`. So `stop` joins the thread; zerolite.shutdown calls it
before the interpreter finalizes.
[Note: two monitors] Only ranks 0 and 1 read all N beats (N small values per interval each);
the others read one key. Two, so that a stopped monitor is still seen by the other.
"""
from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import socket
import sys
import threading
import time

import torch.distributed as dist
from torch.distributed import distributed_c10d

from zerolite.comm.last_collective import RECORD
from zerolite.watchdog.judge import Beat, Settings, judge

EXIT_CODE = 1
MONITORS = 2


class Watchdog:
    def __init__(self, store, rank: int, world_size: int, settings: Settings, prefix: str,
                 store_timeout_s: float = 10.0):
        self.store, self.rank, self.world = store, rank, world_size
        self.store_timeout_s = store_timeout_s
        self.settings, self.prefix = settings, prefix
        self.host = socket.gethostname()
        self.state = "running"
        self.error = ""
        self.suspended = 0
        self._stop = threading.Event()
        self._beat = 0
        now = time.monotonic()
        self._seen_seq, self._progress_at = RECORD.seq, now
        self._seen_step, self._step_at, self._slowest = RECORD.step, now, 0.0
        self._started_at = now
        self._peer_beat: dict[int, int] = {}
        self._peer_changed: dict[int, float] = {}
        self._store_ok_at = now
        self._thread = threading.Thread(target=self._run, name="zerolite-watchdog", daemon=True)

    # -- keys and publishing ------------------------------------------------------------
    def _key(self, rank: int) -> str:
        return f"{self.prefix}beat/{rank}"

    @property
    def verdict_key(self) -> str:
        return f"{self.prefix}verdict"

    def _sample(self, now: float) -> None:
        if RECORD.seq != self._seen_seq:
            self._seen_seq, self._progress_at = RECORD.seq, now
        if RECORD.step != self._seen_step:
            if self._seen_step > 0:  # the first step (warm-up, construction) does not count
                per_step = (now - self._step_at) / max(1, RECORD.step - self._seen_step)
                self._slowest = max(self._slowest, per_step)
            self._seen_step, self._step_at = RECORD.step, now
        if self.state == "running" and not threading.main_thread().is_alive():
            self.state = "done"  # the script returned; a lingering thread is not a fault

    def beat_now(self) -> Beat:
        now = time.monotonic()
        self._sample(now)
        self._beat += 1
        state = "suspended" if self.suspended and self.state == "running" else self.state
        return Beat(rank=self.rank, host=self.host, pid=os.getpid(), beat=self._beat,
                    idle_s=round(now - self._progress_at, 3), where=RECORD.describe(),
                    slowest_step_s=round(self._slowest, 3), steps=self._seen_step,
                    events=self._seen_seq,
                    state=state, error=self.error)

    def publish(self) -> None:
        self.store.set(self._key(self.rank), self.beat_now().dumps())

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.publish()
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> bool:
        """Normal end (also at exit): join the thread (Note: joined at exit), then say so, so
        the others do not read silence as a hang. False if the thread did not end in time."""
        if self.state == "running":
            self.state = "done"
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            # One store call at most is in flight; it ends within the store timeout.
            self._thread.join(self.store_timeout_s + 2 * self.settings.interval_s + 5.0)
            if self._thread.is_alive():
                return False
        try:
            self.publish()
        except Exception:  # noqa: BLE001 - the store may be gone at exit; nothing to report
            pass
        return True

    def mark_failed(self, error: str) -> None:
        """This rank raised: publish the verdict itself (the others exit at their next beat)."""
        self.state, self.error = "failed", error
        try:
            self.publish()
            self.store.compare_set(self.verdict_key, "",
                                   f"{self.who()} failed: {error}; last collective: "
                                   f"{RECORD.describe()}")
        except Exception:  # noqa: BLE001 - monitors still see the stopped heartbeat
            pass

    def who(self) -> str:
        return f"rank {self.rank} (host {self.host}, pid {os.getpid()})"

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            if not dist.is_initialized():  # the script destroyed the group: nothing to watch
                self._retire()
                return
            try:
                verdict = self.tick()
            except Exception as e:  # noqa: BLE001 - store trouble: judged by its duration
                verdict = self._store_trouble(e)
            if verdict is not None:
                self.fire(verdict)

    def _retire(self) -> None:
        if self.state == "running":
            self.state = "done"
        try:
            self.publish()
        except Exception:  # noqa: BLE001 - the group's store may have gone with it
            pass

    def tick(self) -> str | None:
        self.publish()
        if self._stop.is_set():  # stopping: leave the store at once (stop() is joining us)
            return None
        verdict = self._read_verdict()
        if verdict is None and self.rank < MONITORS:
            verdict = self._judge_all()
            if verdict is not None:
                self.store.compare_set(self.verdict_key, "", verdict)
                verdict = self._read_verdict() or verdict
        self._store_ok_at = time.monotonic()
        return verdict

    def _read_verdict(self) -> str | None:
        if not self.store.check([self.verdict_key]):
            return None
        return self.store.get(self.verdict_key).decode() or None

    def _judge_all(self) -> str | None:
        now = time.monotonic()
        keys = [self._key(r) for r in range(self.world)]
        if self.store.check(keys):
            raw = dict(zip(range(self.world), self.store.multi_get(keys)))
        else:
            raw = {r: self.store.get(k) for r, k in enumerate(keys) if self.store.check([k])}
        beats = {r: Beat.loads(v) for r, v in raw.items()}
        age = {}
        for r, b in beats.items():
            if self._peer_beat.get(r) != b.beat:
                self._peer_beat[r], self._peer_changed[r] = b.beat, now
            age[r] = 0.0 if r == self.rank else now - self._peer_changed[r]
        missing = []
        if now - self._started_at > 2 * self.settings.heartbeat_timeout_s:
            missing = [r for r in range(self.world) if r not in beats]
        return judge(beats, age, self.settings, missing)

    def _store_trouble(self, error: Exception) -> str | None:
        down = time.monotonic() - self._store_ok_at
        if down <= self.settings.heartbeat_timeout_s:
            return None
        return (f"the rendezvous store is unreachable from {self.who()} for {down:.0f}s "
                f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
                f"its host (rank 0 or the launcher) is gone or hung")

    def fire(self, verdict: str) -> None:
        """Report the verdict once and leave at once, whatever else this process is doing."""
        line = f"zerolite watchdog [rank {self.rank}]: {verdict}\n"
        try:
            os.write(2, line.encode(errors="replace"))
            if verdict.startswith(f"{self.who()} hung:"):  # alive but stuck: show where
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        finally:
            # Give the other ranks one beat to read the verdict and print their own line.
            time.sleep(min(1.5 * self.settings.interval_s, 2.0))
            launcher = os.environ.get("ZEROLITE_LAUNCHER_PID")
            if launcher and launcher.isdigit():
                try:
                    os.kill(int(launcher), signal.SIGUSR1)
                except OSError:
                    pass
            os._exit(EXIT_CODE)


def store_client(timeout_s: float):
    """The watchdog thread's own client of the default process group's store (Note: out of
    band), with its own timeout. torch < 2.5 has no Store.clone: the group's client is shared."""
    store = distributed_c10d._get_default_store()
    if not hasattr(store, "clone"):
        return store
    client = store.clone()
    client.set_timeout(datetime.timedelta(seconds=timeout_s))
    return client
