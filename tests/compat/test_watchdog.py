"""The watchdog ends a stalled run with a message naming the last event; heartbeats feed it."""

from __future__ import annotations

import os
import time

from openrlhf_dppo.compat.cpu.hooks import ENV_HEARTBEAT
from openrlhf_dppo.compat.cpu.watchdog import Watchdog, heartbeat, stale_op_locks_hint


def test_watchdog_gives_start_up_time_then_names_the_last_event_of_a_stall(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # no op build lock
    hb = str(tmp_path / "hb")
    w = Watchdog(hb, stall_s=10, startup_s=30, on_fire=lambda m: None)
    assert w.check(now=w.started + 29) is None  # starting up
    assert "after start" in w.check(now=w.started + 31)
    with open(hb, "w") as f:
        f.write("weight sync started (pid 1)")
    t = os.path.getmtime(hb)
    assert w.check(now=t + 9) is None
    msg = w.check(now=t + 11)
    assert "weight sync started" in msg and "weight sync is not connected" in msg


def test_watchdog_thread_fires_once_without_progress(tmp_path):
    fired = []
    w = Watchdog(str(tmp_path / "none"), stall_s=0.1, startup_s=0.1, on_fire=fired.append).start()
    w.thread.join(timeout=10)
    assert not w.thread.is_alive()
    assert len(fired) == 1 and "no progress" in fired[0]


def test_heartbeat_records_the_event_and_the_time(tmp_path, monkeypatch):
    hb = tmp_path / "hb"
    monkeypatch.setenv(ENV_HEARTBEAT, str(hb))
    before = time.time()
    heartbeat("weight sync done")
    assert hb.read_text() == f"weight sync done (pid {os.getpid()})"
    assert os.path.getmtime(hb) >= before - 1


def test_heartbeat_without_a_watchdog_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    heartbeat("weight sync done")  # ENV_HEARTBEAT unset (clean_cpu_env)
    assert list(tmp_path.iterdir()) == []


def test_a_stale_deepspeed_op_build_lock_is_named_in_the_stall_message(tmp_path, monkeypatch):
    """A killed op build leaves torch_extensions/<op>/lock, and every later run waits on it silently."""
    ext = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    lock = ext / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    assert stale_op_locks_hint() is None  # a fresh lock: a build may be running
    old = time.time() - 3600
    os.utime(lock, (old, old))
    assert str(lock) in stale_op_locks_hint()
    hb = str(tmp_path / "hb")
    w = Watchdog(hb, stall_s=10, startup_s=30, on_fire=lambda m: None)
    assert str(lock) in w.check(now=w.started + 31) and "delete it" in w.check(now=w.started + 31)
    with open(hb, "w") as f:
        f.write("worker started (pid 1)")
    msg = w.check(now=os.path.getmtime(hb) + 11)
    assert str(lock) in msg and "weight sync is not connected" not in msg
