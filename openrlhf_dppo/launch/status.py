"""What the launcher records in the run's status.json when the trainer process ends without finishing:
the table of docs/SLURM.md, "When the trainer dies: status.json" (the writer: ``openrlhf_dppo.run_dir``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from openrlhf_dppo.run_dir import read_status, write_status

SLURM_REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PENDING"})


@dataclass(frozen=True)
class Outcome:
    """How a trainer exit is recorded: `state` for status.json, `reason` (also the task's error), and
    `wait_s` > 0 when a requeue signal is expected and the launcher should wait that long for it."""

    state: str
    reason: str
    wait_s: float = 0.0


def describe_exit(rc: int) -> str:
    """`Popen.returncode` in words: "exited with code 3", "was killed by signal 9 (SIGKILL)"."""
    if rc >= 0:
        return f"exited with code {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        return f"was killed by signal {-rc}"
    hint = ", e.g. by the out-of-memory killer" if -rc == signal.SIGKILL else ""
    return f"was killed by signal {-rc} ({name}{hint})"


def settle(
    rc: int, *, job_state: str | None, terminated: bool, requeue_asked: bool, requeue_wait_s: float
) -> Outcome | None:
    """The row of the module's table for a trainer exit; None when the trainer finished (rc 0).

    job_state: `slurm_job_state` (None when Slurm could not be asked)."""
    if rc == 0:
        return None
    what = f"the trainer {describe_exit(rc)}"
    if job_state == "CANCELLED":
        return Outcome("cancelled", f"the job was cancelled; {what}")
    if job_state in SLURM_REQUEUE_STATES:
        return Outcome("requeued", f"Slurm requeued the job; {what}")
    if requeue_asked:
        return Outcome("requeued", f"the launcher requeued the job (time limit or preemption); {what}")
    if job_state not in (None, "RUNNING"):  # ending for another reason (TIMEOUT, PREEMPTED, NODE_FAIL)
        return Outcome("failed", f"{what}; the job is ending ({job_state})")
    if terminated and requeue_wait_s > 0:  # a SIGTERM while Slurm keeps the job: a requeue may follow
        return Outcome(
            "failed", f"{what} after a SIGTERM to the job, and no requeue followed", requeue_wait_s
        )
    return Outcome("failed", what)


def slurm_job_state(job_id: str, restart: int, timeout_s: float = 20.0) -> str | None:
    """Why the job is ending, as far as Slurm knows now; None when it cannot be asked. Returns
    "REQUEUED" (scontrol's Restarts above `restart`), else scontrol's state, or sacct's while scontrol says
    COMPLETING ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", ...)."""
    line = _run(["scontrol", "show", "job", "-o", str(job_id)], timeout_s)
    state = re.search(r"\bJobState=(\S+)", line or "")
    if state is None:
        return None
    restarts = re.search(r"\bRestarts=(\d+)", line)
    if restarts and int(restarts.group(1)) > restart:
        return "REQUEUED"
    if state.group(1) != "COMPLETING":
        return state.group(1)
    acct = _run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], timeout_s)
    words = (acct or "").split()
    return words[0] if words else state.group(1)


def _run(cmd: list[str], timeout_s: float) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def newest_checkpoint_step(ckpt_path: str | os.PathLike) -> int:
    """The global step a restart resumes from: the tag in DeepSpeed's `<ckpt>/_actor/latest`, else the
    newest `global_step<N>` folder, else 0 (no checkpoint: the restart starts over)."""
    actor = Path(ckpt_path) / "_actor"
    try:
        tag = (actor / "latest").read_text().strip()
    except OSError:
        tag = ""
    m = re.fullmatch(r"global_step(\d+)", tag)
    if m:
        return int(m.group(1))
    steps = [int(p.name[len("global_step") :]) for p in actor.glob("global_step*") if p.name[11:].isdigit()]
    return max(steps, default=0)


def record(outcome: Outcome, run_dir: str | os.PathLike, ckpt_path: str | os.PathLike) -> dict:
    """Write the outcome to `<run_dir>/status.json`; returns what was written. The step: the newest
    checkpoint's when requeued, else the trainer's last (else the checkpoint's); max_steps is kept."""
    try:
        previous = read_status(run_dir) or {}
    except ValueError:  # unreadable: replaced
        previous = {}
    if outcome.state == "requeued" or "step" not in previous:
        step = newest_checkpoint_step(ckpt_path)
    else:
        step = int(previous["step"])
    reason = outcome.reason
    if outcome.state == "failed" and previous.get("state") == "interrupted" and previous.get("reason"):
        reason = f"{reason}; the trainer said: {previous['reason']}"  # e.g. which Ray process died
    return write_status(run_dir, outcome.state, step, max_steps=previous.get("max_steps"), reason=reason)
