"""The watchdog: workers write a heartbeat file at each actor training pass and weight sync; a driver
thread (``Watchdog``, started by the ``ray.init`` wrapper) ends the run, saying where it stopped, when the
file has not changed for ``OPENRLHF_DPPO_WATCHDOG_S`` seconds (600).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Callable

from openrlhf_dppo.compat.cpu.hooks import ENV_DISABLE, ENV_HEARTBEAT, ENV_WATCHDOG, after_import, log, once


def heartbeat(event: str) -> None:
    """Record progress for the watchdog (a file whose mtime and content are the last event)."""
    path = os.environ.get(ENV_HEARTBEAT)
    if path:
        try:
            with open(path, "w") as f:
                f.write(f"{event} (pid {os.getpid()})")
        except OSError:
            pass


def install_heartbeats() -> None:
    """Progress marks around each actor training pass and weight sync (a sync wrapped by ``verify_sync``
    keeps that wrapper, which marks "weight sync done")."""

    def patch(module):
        def factory(original, event):
            @functools.wraps(original)
            def wrapped(self, *args, **kwargs):
                heartbeat(f"{event} started")
                out = original(self, *args, **kwargs)
                heartbeat(f"{event} done")
                return out

            return wrapped

        once(module.ActorPPOTrainer, "ppo_train", lambda o: factory(o, "actor training"))
        once(module.ActorPPOTrainer, "broadcast_to_vllm", lambda o: factory(o, "weight sync"))

    after_import("openrlhf.trainer.ray.ppo_actor", patch)
    heartbeat("worker started")


class Watchdog:
    """Calls ``on_fire(message)`` once, from its thread, when the heartbeat file has not changed for
    ``stall_s`` seconds (``startup_s`` before the first); default: end the run."""

    def __init__(
        self, heartbeat_path: str, stall_s: float, startup_s: float, on_fire: Callable | None = None
    ):
        self.path, self.stall_s, self.startup_s = heartbeat_path, stall_s, startup_s
        self.on_fire = on_fire or _end_run
        self.started = time.time()
        self.thread = threading.Thread(target=self._run, name="openrlhf-dppo-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self.thread.start()
        return self

    def check(self, now: float | None = None) -> str | None:
        """The message to end the run with, or None while progress is being made."""
        now = time.time() if now is None else now
        try:
            last: float | None = os.path.getmtime(self.path)
            with open(self.path) as f:
                event: str | None = f.read().strip()
        except OSError:
            last, event = None, None
        if last is None:
            if now - self.started > self.startup_s:
                hint = stale_op_locks_hint()
                return f"no progress {now - self.started:.0f}s after start (limit {self.startup_s:.0f}s)" + (
                    f". {hint}" if hint else ""
                )
            return None
        if now - last > self.stall_s:
            return f"no progress for {now - last:.0f}s (limit {self.stall_s:.0f}s); last event: {event}. " + (
                stale_op_locks_hint()
                or "A hang here usually means the trainer -> vLLM weight sync is not connected "
                f"(check that the gloo_weight_sync and worker_extension patches are on: {ENV_DISABLE})"
            )
        return None

    def _run(self):
        while True:
            time.sleep(2.0)
            msg = self.check()
            if msg:
                self.on_fire(msg)
                return


def stale_op_locks_hint(root: str | None = None) -> str | None:
    """A line naming the ``lock`` files of torch's C++ extension builds (DeepSpeed's CPU ops) under
    ``root`` (``TORCH_EXTENSIONS_DIR``, else ~/.cache/torch_extensions) older than 10 minutes, or None."""
    root = root or os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/torch_extensions")
    locks = sorted(os.path.join(d, "lock") for d, _, files in os.walk(root) if "lock" in files)
    old = [p for p in locks if time.time() - os.path.getmtime(p) > 600]
    if not old:
        return None
    return (
        f"A DeepSpeed op build lock is held with no build running: {', '.join(old)}. A killed build leaves it, "
        "and every run then waits on it; delete it (no other run building ops on this machine) and start again"
    )


def _end_run(msg: str) -> None:
    log(f"WATCHDOG: {msg}. Ending the run.")
    try:
        import psutil

        for child in psutil.Process(os.getpid()).children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    finally:
        os._exit(3)


def start_watchdog(stall_s: float | None = None, startup_s: float | None = None) -> Watchdog:
    """Start the driver's watchdog on a fresh heartbeat file (its path goes to the workers' env)."""
    hb = os.environ.setdefault(ENV_HEARTBEAT, f"/tmp/openrlhf_dppo_heartbeat_{os.getpid()}")
    if os.path.exists(hb):
        os.remove(hb)
    stall = stall_s or float(os.environ.get(ENV_WATCHDOG, "600"))
    return Watchdog(hb, stall, startup_s or max(stall, 900.0)).start()
