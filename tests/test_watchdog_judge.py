"""The watchdog's rules (zerolite/watchdog/judge.py) and settings, without processes."""
from __future__ import annotations

import pytest

from zerolite.config import load_config
from zerolite.errors import ZeroliteConfigError, ZeroliteError
from zerolite.watchdog import resolve
from zerolite.watchdog.judge import WARMUP_FACTOR, Beat, Settings, judge

S = Settings(heartbeat_timeout_s=3.0, stall_timeout_s=5.0, stall_step_factor=5.0, interval_s=0.5)


def beat(rank, *, idle=0.1, events=40, steps=3, slowest=0.2, state="running", error=""):
    return Beat(rank=rank, host=f"h{rank}", pid=100 + rank, beat=7, idle_s=idle,
                where=f"all_gather #{events}", slowest_step_s=slowest, steps=steps,
                events=events, state=state, error=error)


def two(b0, b1):
    return {0: b0, 1: b1}


def test_healthy_ranks_no_verdict():
    assert judge(two(beat(0), beat(1)), {0: 0.0, 1: 0.4}, S) is None


def test_failed_rank_named_with_error_and_collective():
    v = judge(two(beat(0), beat(1, state="failed", error="ValueError: x")), {}, S)
    assert v == "rank 1 (host h1, pid 101) failed: ValueError: x; last collective: all_gather #40"


def test_stale_heartbeat_names_the_stalest_rank():
    beats = {r: beat(r) for r in range(4)}
    v = judge(beats, {0: 0.0, 1: 3.5, 2: 9.0, 3: 0.2}, S)
    assert v.startswith("rank 2 (host h2, pid 102) stopped responding: no heartbeat for 9s")
    assert judge(beats, {0: 0.0, 1: 2.9, 2: 2.9, 3: 0.2}, S) is None  # within the limit


def test_done_rank_is_not_stale():
    assert judge(two(beat(0), beat(1, state="done")), {0: 0.0, 1: 60.0}, S) is None


def test_stall_names_the_rank_that_is_behind():
    # rank 0 waits in the collective rank 1 never entered: rank 1 has one event fewer
    v = judge(two(beat(0, idle=6.0, events=61), beat(1, idle=5.9, events=60)), {}, S)
    assert v.startswith("rank 1 (host h1, pid 101) hung: no progress for 6s (limit 5s)")
    assert v.endswith("others: rank 0: all_gather #61")


def test_stall_with_equal_events_names_the_longest_idle():
    v = judge(two(beat(0, idle=5.2), beat(1, idle=7.0)), {1: 0.3}, S)
    assert v.startswith("rank 1 (host h1, pid 101) hung: no progress for 7s")


def test_stall_limit_follows_the_slowest_step():
    slow = {0: beat(0, idle=9.0, slowest=2.0), 1: beat(1, idle=9.0, slowest=1.0)}
    assert judge(slow, {}, S) is None  # 9 s < 5 x 2 s
    slow[0].idle_s = slow[1].idle_s = 10.5
    assert "(limit 10s)" in judge(slow, {}, S)


def test_warmup_limit_until_two_steps():
    beats = two(beat(0, idle=6.0, steps=1), beat(1, idle=6.0, steps=5))
    assert judge(beats, {}, S) is None
    beats[0].idle_s = 5.0 * WARMUP_FACTOR + 0.5
    assert "hung" in judge(beats, {}, S)


def test_suspended_rank_pauses_stall_not_heartbeat():
    beats = two(beat(0, idle=60.0), beat(1, idle=60.0, state="suspended"))
    assert judge(beats, {}, S) is None
    assert "stopped responding" in judge(beats, {1: 4.0}, S)


def test_missing_rank_named():
    v = judge({0: beat(0)}, {}, S, missing=[1])
    assert v.startswith("rank 1 never sent a heartbeat")


def test_beat_round_trips():
    b = beat(3, state="failed", error="E: é")
    assert Beat.loads(b.dumps()) == b


def _extras(**keys):
    return load_config({"train_batch_size": 2, "zerolite": keys}, 1).zerolite


def test_settings_from_config_then_env(monkeypatch):
    for k in ("ZEROLITE_WATCHDOG", "ZEROLITE_WATCHDOG_HEARTBEAT_S", "ZEROLITE_WATCHDOG_STALL_S",
              "ZEROLITE_WATCHDOG_STALL_FACTOR", "ZEROLITE_WATCHDOG_INTERVAL_S"):
        monkeypatch.delenv(k, raising=False)
    assert resolve(_extras()) == (True, Settings(20.0, 45.0, 5.0, 1.0))
    extras = _extras(watchdog_heartbeat_timeout_s=9, watchdog_stall_timeout_s=7,
                     watchdog_stall_step_factor=2, watchdog_interval_s=3)
    assert resolve(extras) == (True, Settings(9.0, 7.0, 2.0, 3.0))
    monkeypatch.setenv("ZEROLITE_WATCHDOG_STALL_S", "11")
    monkeypatch.setenv("ZEROLITE_WATCHDOG", "0")
    assert resolve(extras) == (False, Settings(9.0, 11.0, 2.0, 3.0))
    monkeypatch.setenv("ZEROLITE_WATCHDOG_STALL_S", "soon")
    with pytest.raises(ZeroliteError, match="ZEROLITE_WATCHDOG_STALL_S='soon' is not a number"):
        resolve(extras)
    monkeypatch.setenv("ZEROLITE_WATCHDOG_STALL_S", "11")
    monkeypatch.setenv("ZEROLITE_WATCHDOG", "yes")
    with pytest.raises(ZeroliteError, match="ZEROLITE_WATCHDOG='yes': expected 0 or 1"):
        resolve(extras)


@pytest.mark.parametrize("keys, path", [
    ({"watchdog": "on"}, "zerolite.watchdog"),
    ({"watchdog_heartbeat_timeout_s": 0}, "zerolite.watchdog_heartbeat_timeout_s"),
    ({"watchdog_stall_timeout_s": -1}, "zerolite.watchdog_stall_timeout_s"),
    ({"watchdog_stall_step_factor": 0.5}, "zerolite.watchdog_stall_step_factor"),
    ({"watchdog_interval_s": 10}, "zerolite.watchdog_interval_s"),
])
def test_bad_watchdog_keys_name_the_key(keys, path):
    with pytest.raises(ZeroliteConfigError, match=path.replace(".", r"\.")):
        _extras(**keys)
