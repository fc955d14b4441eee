"""End to end: a SIGTERM to the real trainer actor (what a Slurm cancel or requeue sends every process of
the job), or, under a launcher, the death of a policy actor first, leaves status.json "interrupted" at
the last finished step -- never "failed" -- for the launcher to replace with its outcome. The tiny DPPO
run of test_tiny_pipeline.py, stopped after step 1. About 2 minutes a test on 2 cores once the tiny
assets are built.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from openrlhf_dppo import run_dir as R

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tiny_pipeline import DPPO_FLAGS, ROOT, RUN_TIMEOUT_S, common_flags, tiny  # noqa: E402

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _status(out: str) -> dict:
    try:
        with open(os.path.join(out, "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _stop_after_step_1(out: str, actor: str, sig: int, env_extra: dict | None = None) -> tuple[int, dict]:
    """Run the tiny DPPO run, send ``sig`` to the Ray actor process whose name contains ``actor`` once
    step 1 is recorded; returns (the CLI's exit code, status.json after it exited)."""
    os.makedirs(out)
    flags = common_flags(out, episodes=20) + DPPO_FLAGS  # 40 steps: stopped long before its end
    env = dict(os.environ, OPENRLHF_DPPO_WATCHDOG_S="300", **(env_extra or {}))
    with open(os.path.join(out, "train.log"), "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "openrlhf_dppo.cli.train_dppo_ray", *flags], cwd=ROOT, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while _status(out).get("step", 0) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _status(out).get("state") == "running", open(os.path.join(out, "train.log")).read()[-4000:]
        found = [
            p for p in _descendants(proc.pid) if _cmdline(p).startswith("ray::") and actor in _cmdline(p)
        ]
        assert len(found) == 1, [_cmdline(p) for p in _descendants(proc.pid)]
        os.kill(found[0], sig)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, _status(out)


def test_a_sigterm_to_the_trainer_actor_leaves_the_run_interrupted_not_failed(tiny, tmp_path):
    returncode, status = _stop_after_step_1(str(tmp_path / "stopped"), "Trainer", signal.SIGTERM)
    assert returncode != 0
    assert status["state"] == "interrupted" and status["step"] >= 1, status
    assert status["reason"].startswith("the trainer was stopped (SystemExit"), status


def test_a_policy_actor_killed_under_a_launcher_leaves_the_run_interrupted(tiny, tmp_path):
    # A cancel stops every process of the job, and the policy actor may die first: the real trainer then
    # gets Ray's actor-died error. Under a launcher (which records the outcome: OPENRLHF_DPPO_LAUNCHED,
    # set by launch.node for everything it starts) that is "interrupted", never a "failed" that the
    # launcher's record would replace a moment later.
    env = {R.LAUNCHED_ENV: "1"}
    returncode, status = _stop_after_step_1(str(tmp_path / "killed"), "PolicyModelActor", signal.SIGKILL, env)
    assert returncode != 0
    assert status["state"] == "interrupted" and status["step"] >= 1, status
    assert status["reason"].startswith("a Ray process of the run died ("), status
