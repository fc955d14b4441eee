"""A signal that stops the trainer (a cancel, a requeue) never shows the run as failed: the real
``DPPOTrainer.fit`` records "interrupted" (not final, readers take it as in progress), and the
launcher's outcome is the only final state. Ordinary errors are still "failed", with their reason."""

import json
import os
import signal
import subprocess
import sys
import time

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.launch import status as S
from openrlhf_dppo.report.run import load_run

WORKER = os.path.join(os.path.dirname(__file__), "trainer_stop_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stop_fit_with(sig: int, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    run_dir, ready = tmp_path / "run", tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, WORKER, str(run_dir), str(ready)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), proc.communicate(timeout=60)[0][-3000:] if proc.poll() is not None else "no start"
    assert json.loads((run_dir / R.STATUS).read_text())["state"] == "running"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), json.loads(
        (run_dir / R.STATUS).read_text()
    )


def test_a_sigterm_in_fit_records_interrupted_not_failed_and_the_launcher_writes_the_outcome(tmp_path):
    proc, status = _stop_fit_with(signal.SIGTERM, tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]  # the exit code Ray's handler gives
    # what a monitor reads between the trainer's death and the launcher's record
    assert (status["state"], status["step"], status["max_steps"]) == ("interrupted", 6, 9), status
    assert "the trainer was stopped (SystemExit" in status["reason"]
    run_dir = tmp_path / "run"
    (run_dir / R.RUN_CONFIG).write_text("{}")
    (run_dir / R.METRICS).write_text(json.dumps({"kind": "train", "step": 6}) + "\n")
    run = load_run(run_dir)
    assert run.in_progress and run.describe_state() == "interrupted (step 6/9)"
    # the launcher's record is final; a late "interrupted" from a trainer still stopping leaves it
    S.record(S.Outcome("cancelled", "the job was cancelled"), run_dir, run_dir / "ckpt")
    R.write_status(run_dir, R.INTERRUPTED, 6, reason="late")
    final = R.read_status(run_dir)
    assert (final["state"], final["step"], final["reason"]) == ("cancelled", 6, "the job was cancelled")
    assert not load_run(run_dir).in_progress


def test_ctrl_c_in_fit_records_interrupted(tmp_path):
    proc, status = _stop_fit_with(signal.SIGINT, tmp_path)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stdout, proc.stdout[-3000:]
    assert (status["state"], status["step"]) == ("interrupted", 6)


def test_an_error_is_failed_with_its_reason_and_interrupted_never_hides_an_outcome(tmp_path):
    assert R.ended_by(RuntimeError("reward file\nbroke")) == ("failed", "RuntimeError: reward file broke")
    assert R.ended_by(SystemExit(1))[0] == R.ended_by(KeyboardInterrupt())[0] == "interrupted"
    for outcome in ("failed", "cancelled", "requeued"):
        R.write_status(tmp_path, outcome, 3)
        assert R.write_status(tmp_path, "interrupted", 4)["state"] == outcome
        assert R.read_status(tmp_path)["state"] == outcome
    R.write_status(tmp_path, "running", 5)  # a restart: running again, then stopped again
    assert R.write_status(tmp_path, "interrupted", 5)["state"] == "interrupted"


def test_a_dead_ray_process_leaves_a_launched_run_interrupted_and_a_plain_run_failed():
    # A Slurm cancel stops every process of the job: a policy actor may die before the trainer sees its
    # own SIGTERM, and the trainer's ray.get then raises Ray's ActorDiedError (or a task error caused
    # by it). Under a launcher (which records the outcome) that is "interrupted", never a brief
    # "failed"; without one the trainer's record is the last word, so it stays "failed".
    from ray.exceptions import ActorDiedError, RayTaskError

    died = ActorDiedError()
    wrapped = RayTaskError("fit", "Traceback ...", died).as_instanceof_cause()
    for err in (died, wrapped):
        state, why = R.ended_by(err, launched=True)
        assert state == "interrupted" and why.startswith("a Ray process of the run died ("), why
        assert R.ended_by(err, launched=False)[0] == "failed"
    assert R.ended_by(RuntimeError("reward file broke"), launched=True)[0] == "failed"  # our own error
