"""The processes of a Slurm task: process groups stopped as a whole, and the job's signals kept away
from the children (Ray, the trainer) and out of the teardown.

Every child runs in its own session (`start_new_session=True`), so stopping it means signalling its
process group, which also reaches whatever it started; never `ray stop` (it kills every Ray process of
the machine, including other jobs sharing the node).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


def pid_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an exited child nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def terminate_group(pid: int, grace_s: float) -> None:
    """SIGTERM the process group led by `pid`, SIGKILL it if the leader still runs after `grace_s`.
    Never waits on the child: safe inside a signal handler that interrupted a `Popen.wait()`."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while pid_running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_process_group(proc: subprocess.Popen | None, grace_s: float = 20.0) -> None:
    """``terminate_group`` of `proc` (started with start_new_session), then reap it."""
    if proc is not None:
        terminate_group(proc.pid, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)


def ignore_job_signals() -> None:
    """In the children (Ray, the trainer): ignore the USR2 Slurm sends to every process of the job before
    a time limit; the launcher alone decides how to stop them. SIG_IGN survives exec."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


@contextlib.contextmanager
def signals_held():
    """Hold the job's signals (USR2: submitit's requeue handler exits the process; TERM) while Ray is
    torn down, so that a handler cannot leave Ray processes behind; they are delivered after."""
    held = {signal.SIGUSR2, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
