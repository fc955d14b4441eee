"""How a Slurm job records the end of its trainer, without a cluster.

Stand-ins: `scontrol` is a script on PATH that prints the job state a test chooses, submitit's job
environment is a namespace, and `run_head` (Ray + the trainer) is replaced where the test is about what
the launcher does with the trainer's exit; `run_head` itself runs for real with `sleep` as Ray.
"""

import json
import os
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.launch import command as C
from openrlhf_dppo.launch import node as N
from openrlhf_dppo.launch import ray_cluster as RC
from openrlhf_dppo.launch import slurm as L
from openrlhf_dppo.launch import status as S
from openrlhf_dppo.report.run import load_run
from openrlhf_dppo.run_dir import write_status

JOB = "900017"


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """Stand-ins for `scontrol show job -o ID` and `sacct ... -o State` printing what a test chooses:
    .set(state, restarts=0, acct="") as Slurm shows a job (see the states seen on a real cluster in
    `test_slurm_job_state_tells_a_cancel_from_a_requeue_while_both_are_completing`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    files = {name: tmp_path / f"slurm_{name}" for name in ("state", "restarts", "acct")}
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "JobId=$4 JobName=t JobState=$(cat {files["state"]}) Reason=None '
        f'Restarts=$(cat {files["restarts"]}) BatchFlag=1"\n'
    )
    (bin_dir / "sacct").write_text(f"#!/bin/sh\ncat {files['acct']}\n")
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def set_state(state, restarts=0, acct=""):
        files["state"].write_text(state)
        files["restarts"].write_text(str(restarts))
        files["acct"].write_text(acct)

    set_state("RUNNING")
    return SimpleNamespace(set=set_state)


@pytest.fixture
def slurm_env(tmp_path, monkeypatch):
    for key, value in {"SLURM_JOB_ID": JOB, "SLURM_PROCID": "0", "SLURM_JOB_NUM_NODES": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    folder = tmp_path / "slurm" / JOB
    paths = SimpleNamespace(folder=folder, stdout=folder / f"{JOB}_0_log.out")
    monkeypatch.setattr(L.submitit, "JobEnvironment", lambda: SimpleNamespace(paths=paths, job_id=JOB))


def _job(tmp_path, **kwargs) -> L.RayJob:
    cmd = C.build_train_command(["--max_steps", "9"], run_dir=tmp_path / "run", save_steps=1)
    return L.RayJob(cmd, **kwargs)


def _trainer_ran(job, *, last_step: int, ckpt_step: int | None):
    """What a trainer leaves before it dies: its status at `last_step`, a checkpoint at `ckpt_step`."""
    run = job.command.status_dir
    run.mkdir(parents=True, exist_ok=True)
    (run / "run_config.json").write_text(json.dumps({"algo": "dppo"}))
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, last_step + 1):
            f.write(json.dumps({"kind": "train", "step": step, "time": float(step)}) + "\n")
    status = {"state": "running", "step": last_step, "max_steps": 9, "updated": 1.0}
    (run / "status.json").write_text(json.dumps(status))
    if ckpt_step is not None:
        actor = job.command.ckpt_path / "_actor"
        (actor / f"global_step{ckpt_step}").mkdir(parents=True)
        (actor / "latest").write_text(f"global_step{ckpt_step}")


def _fake_head(monkeypatch, rc: int, before_exit=None):
    def run_head(rdv, cmd, **kwargs):
        if before_exit is not None:
            before_exit(kwargs)
        return rc

    monkeypatch.setattr(N, "run_head", run_head)


def _status(job) -> dict:
    return json.loads((job.command.status_dir / "status.json").read_text())


def test_a_trainer_killed_by_sigkill_is_marked_failed_with_the_signal_and_nobody_waits(
    tmp_path, monkeypatch, scontrol, slurm_env, capsys
):
    job = _job(tmp_path, requeue_wait_s=30)
    _trainer_ran(job, last_step=4, ckpt_step=3)
    _fake_head(monkeypatch, -signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"the trainer was killed by signal 9 \(SIGKILL, e.g. by the out-of"
    ):
        job()
    assert time.monotonic() - t0 < 10  # no wait for a requeue nobody asked for
    status = _status(job)
    assert status["state"] == "failed" and status["step"] == 4 and status["max_steps"] == 9
    assert (
        status["reason"] == "the trainer was killed by signal 9 (SIGKILL, e.g. by the out-of-memory killer)"
    )
    assert "waiting" not in capsys.readouterr().out
    # compare reads status.json: the run is over, not in progress
    run = load_run(job.command.status_dir)
    assert not run.in_progress and run.describe_state() == "failed"


def test_a_trainer_that_exits_with_an_error_is_marked_failed_with_its_exit_code(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    job = _job(tmp_path)
    _trainer_ran(job, last_step=2, ckpt_step=None)
    _fake_head(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="the trainer exited with code 3"):
        job()
    assert _status(job)["state"] == "failed" and _status(job)["step"] == 2


def _sigterm_to_self(kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # what Slurm sends every process of the job
    time.sleep(0.2)  # let the handler run


def test_a_cancelled_job_is_recorded_as_cancelled_and_does_not_wait_for_a_requeue(
    tmp_path, monkeypatch, scontrol, slurm_env, capsys
):
    scontrol.set("COMPLETING", acct="CANCELLED by 0\n")  # what Slurm shows during a cancel
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what submitit installs (it logs and ignores it)
    job = _job(tmp_path, requeue_wait_s=30)
    _trainer_ran(job, last_step=5, ckpt_step=4)
    _fake_head(monkeypatch, -signal.SIGTERM, _sigterm_to_self)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the job was cancelled; the trainer was killed by signal 15"):
        job()
    assert time.monotonic() - t0 < 10
    assert _status(job)["state"] == "cancelled" and _status(job)["step"] == 5
    assert "requeue" not in capsys.readouterr().out


def test_a_cancel_is_recorded_before_ray_is_stopped_and_once(
    tmp_path, monkeypatch, scontrol, slurm_env, capsys
):
    # Slurm SIGKILLs a cancelled task KillWait s (default 30, 10 on the local cluster) after its
    # SIGTERM; stopping Ray can take longer, so the record must not wait for it
    scontrol.set("COMPLETING", acct="CANCELLED by 0\n")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    job = _job(tmp_path, requeue_wait_s=30)
    _trainer_ran(job, last_step=5, ckpt_step=4)
    during_teardown = []

    def run_head(rdv, cmd, on_driver_exit, **kwargs):
        on_driver_exit(-signal.SIGTERM)  # the trainer is gone; Ray is being stopped from here on
        during_teardown.append(_status(job))
        return -signal.SIGTERM

    monkeypatch.setattr(N, "run_head", run_head)
    with pytest.raises(RuntimeError, match="the job was cancelled; the trainer was killed by signal 15"):
        job()
    (status,) = during_teardown
    assert status["state"] == "cancelled" and status["step"] == 5
    assert capsys.readouterr().out.count("run marked cancelled") == 1


def test_a_sigterm_awaiting_its_requeue_signal_is_not_recorded_before_the_wait(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    job = _job(tmp_path, requeue_wait_s=1)
    _trainer_ran(job, last_step=3, ckpt_step=2)
    during_teardown = []

    def run_head(rdv, cmd, on_driver_exit, **kwargs):
        _sigterm_to_self(kwargs)
        on_driver_exit(-signal.SIGTERM)
        during_teardown.append(_status(job)["state"])
        return -signal.SIGTERM

    monkeypatch.setattr(N, "run_head", run_head)
    with pytest.raises(RuntimeError, match="and no requeue followed within 1s"):
        job()
    assert during_teardown == ["running"] and _status(job)["state"] == "failed"


def test_a_job_slurm_requeues_shows_requeued_at_the_newest_checkpoint_and_leaves_no_result(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    scontrol.set("COMPLETING", restarts=1, acct="REQUEUED\n")  # `scontrol requeue` by hand
    job = _job(tmp_path)
    _trainer_ran(job, last_step=7, ckpt_step=6)
    _fake_head(monkeypatch, -signal.SIGTERM, _sigterm_to_self)
    with pytest.raises(SystemExit):  # not an exception: submitit must not write a result for this run
        job()
    status = _status(job)
    assert status["state"] == "requeued" and status["step"] == 6 and status["max_steps"] == 9
    assert status["reason"].startswith("Slurm requeued the job; the trainer was killed by signal 15")


def _submitit_usr2_handler(job, at_requeue=None):
    """What submitit does on USR2 in task 0: call checkpoint(), `scontrol requeue`, exit."""

    def handler(signum, frame):
        job.checkpoint()
        if at_requeue is not None:  # the moment Slurm takes the job back (it may kill us from here on)
            at_requeue.append(_status(job))
        raise SystemExit(-1)

    return handler


def test_a_sigterm_then_the_requeue_signal_marks_the_run_requeued_without_sitting_out_the_wait(
    tmp_path, monkeypatch, scontrol, slurm_env, capsys
):
    job = _job(tmp_path, requeue_wait_s=20)
    _trainer_ran(job, last_step=3, ckpt_step=2)
    signal.signal(signal.SIGUSR2, _submitit_usr2_handler(job))
    _fake_head(monkeypatch, -signal.SIGTERM, _sigterm_to_self)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(SystemExit):
        job()
    timer.join()
    assert time.monotonic() - t0 < 10
    assert "waiting 20s for it" in capsys.readouterr().out
    assert _status(job)["state"] == "requeued" and _status(job)["step"] == 2


def test_a_sigterm_with_no_requeue_after_it_ends_as_failed_after_the_wait(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    job = _job(tmp_path, requeue_wait_s=1)
    _trainer_ran(job, last_step=3, ckpt_step=2)
    _fake_head(monkeypatch, -signal.SIGTERM, _sigterm_to_self)
    with pytest.raises(RuntimeError, match="and no requeue followed within 1s"):
        job()
    assert _status(job)["state"] == "failed" and _status(job)["step"] == 3


def test_the_time_limit_signal_stops_the_trainer_and_ray_and_marks_the_run_requeued_before_requeueing(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    job = _job(tmp_path, stop_grace_s=5)
    _trainer_ran(job, last_step=5, ckpt_step=4)
    at_requeue = []
    signal.signal(signal.SIGUSR2, _submitit_usr2_handler(job, at_requeue))
    ray_head = subprocess.Popen(["sleep", "60"], start_new_session=True)
    trainer = subprocess.Popen(["sleep", "60"], start_new_session=True)

    def run_head(rdv, cmd, on_head_start, on_driver_start, **kwargs):
        on_head_start(ray_head)
        on_driver_start(trainer)
        os.kill(os.getpid(), signal.SIGUSR2)
        return trainer.wait()

    monkeypatch.setattr(N, "run_head", run_head)
    with pytest.raises(SystemExit):
        job()
    assert trainer.wait(timeout=10) == -signal.SIGTERM  # checkpoint() stopped it
    assert ray_head.wait(timeout=10) == -signal.SIGTERM  # and Ray: no actor of it writes after us
    (status,) = at_requeue
    assert status["state"] == "requeued" and status["step"] == 4
    assert status["reason"] == "the launcher stopped the trainer and requeued the job"
    assert job.__getstate__()["_requeue_asked"] is False  # the resubmission starts clean
    # submitit's `scontrol requeue` runs next as a child of this task, and the requeue SIGTERMs the
    # whole job: the child must outlive that SIGTERM (an ignored signal stays ignored across exec)
    child = subprocess.run(["sh", "-c", "kill -TERM $$; echo outlived"], capture_output=True, text=True)
    assert child.stdout == "outlived\n"


def test_run_head_reports_the_trainers_exit_before_it_stops_ray(tmp_path, monkeypatch):
    heads = []
    monkeypatch.setattr(RC, "ray_start_command", lambda **kwargs: ["sleep", "60"])  # Ray stand-in
    monkeypatch.setattr(RC, "wait_for_nodes", lambda *args, **kwargs: ["node-1"])
    rdv = RC.Rendezvous.for_job(tmp_path / "rdv", JOB, 0, temp_root=tmp_path)
    os.makedirs(rdv.ray_temp_dir)
    seen = []
    rc = RC.run_head(
        rdv,
        ["bash", "-c", "exit 7"],
        num_nodes=1,
        num_cpus=1,
        num_gpus=0,
        port=1,
        join_timeout_s=5,
        on_head_start=heads.append,
        on_driver_exit=lambda code: seen.append((code, heads[0].poll(), os.path.exists(rdv.ray_temp_dir))),
    )
    assert rc == 7 and seen == [(7, None, True)]  # Ray still up and its temp dir there when told
    assert heads[0].poll() == -signal.SIGTERM and not os.path.exists(rdv.ray_temp_dir)


def test_sbatch_node_records_a_cancel_before_ray_is_stopped(tmp_path, monkeypatch, scontrol, slurm_env):
    scontrol.set("COMPLETING", acct="CANCELLED by 0\n")
    during_teardown = []

    def run_head(rdv, cmd, on_driver_exit, **kwargs):
        on_driver_exit(-signal.SIGKILL)
        during_teardown.append(json.loads((tmp_path / "run" / "status.json").read_text())["state"])
        return -signal.SIGKILL

    monkeypatch.setattr(N, "run_head", run_head)
    cmd = C.build_train_command([], run_dir=tmp_path / "run", entry="x.py").argv
    assert N.main(["run", "--rendezvous-root", str(tmp_path / "rdv"), "--", *cmd]) == 128 + signal.SIGKILL
    assert during_teardown == ["cancelled"]


def test_run_head_returns_as_soon_as_a_killed_trainer_is_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(RC, "ray_start_command", lambda **kwargs: ["sleep", "60"])  # Ray stand-in
    monkeypatch.setattr(RC, "wait_for_nodes", lambda *args, **kwargs: ["node-1"])
    rdv = RC.Rendezvous.for_job(tmp_path / "rdv", JOB, 0, temp_root=tmp_path)
    os.makedirs(rdv.ray_temp_dir)
    t0 = time.monotonic()
    rc = RC.run_head(
        rdv, ["bash", "-c", "kill -9 $$"], num_nodes=1, num_cpus=1, num_gpus=0, port=1, join_timeout_s=5
    )
    assert rc == -signal.SIGKILL and time.monotonic() - t0 < 10
    assert rdv.is_done() and not os.path.exists(rdv.ray_temp_dir)


def test_a_task_removes_the_ray_temp_dirs_earlier_restarts_of_its_job_left(tmp_path, capsys):
    for name in ("ray_dppo_ray_77_r0", "ray_dppo_ray_77_r1", "ray_dppo_ray_77_r2", "ray_dppo_ray_777_r0"):
        (tmp_path / name / "session_latest").mkdir(parents=True)
    (tmp_path / "ray_dppo_ray_77_r0x").mkdir()
    task = N.SlurmTask(job_id="77", restart=2, rank=1, num_nodes=2, cpus=None)
    rdv = N.prepare(task, tmp_path / "rdv", temp_root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ray_dppo_ray_777_r0",  # another job's
        "ray_dppo_ray_77_r0x",  # not a restart's
        "ray_dppo_ray_77_r2",  # this restart's (the other task on this node may use it already)
    ]
    assert rdv.ray_temp_dir == str(tmp_path / "ray_dppo_ray_77_r2")
    assert f"removed {tmp_path / 'ray_dppo_ray_77_r0'}" in capsys.readouterr().out


def test_a_worker_whose_ray_died_waits_for_the_head_before_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(RC, "ray_start_command", lambda **kwargs: ["true"])  # this node's Ray exits at once
    rdv = RC.Rendezvous.for_job(tmp_path, JOB, 0, temp_root=tmp_path)
    rdv.publish_head("127.0.0.1:1")
    timer = threading.Timer(1.5, rdv.mark_done)
    timer.start()
    RC.run_worker(rdv, num_cpus=1, num_gpus=0, join_timeout_s=5, lost_grace_s=30)  # the head finished
    timer.join()
    rdv = RC.Rendezvous.for_job(tmp_path, JOB, 1, temp_root=tmp_path)
    rdv.publish_head("127.0.0.1:1")
    with pytest.raises(RC.RayClusterError, match="did not finish within 1s"):
        RC.run_worker(rdv, num_cpus=1, num_gpus=0, join_timeout_s=5, lost_grace_s=1)


# ----------------------------------------------------------------- the sbatch template's node entry point
def _node_run(tmp_path, monkeypatch, rc, before_exit=None) -> int:
    def run_head(rdv, cmd, **kwargs):
        if before_exit is not None:
            before_exit(kwargs)
        return rc

    monkeypatch.setattr(N, "run_head", run_head)
    cmd = C.build_train_command([], run_dir=tmp_path / "run", entry="x.py").argv
    return N.main(["run", "--rendezvous-root", str(tmp_path / "rdv"), "--", *cmd])


def test_sbatch_node_marks_the_run_requeued_when_the_batch_script_asked_for_it(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    (tmp_path / "run" / "ckpt" / "_actor").mkdir(parents=True)
    (tmp_path / "run" / "ckpt" / "_actor" / "latest").write_text("global_step5")
    assert N.main(["mark-requeue", "--rendezvous-root", str(tmp_path / "rdv")]) == 0  # the USR1 trap
    assert _node_run(tmp_path, monkeypatch, 0, _sigterm_to_self) == 0
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "requeued" and status["step"] == 5


def test_sbatch_node_marks_a_stopped_step_without_a_requeue_as_failed_and_a_cancel_as_cancelled(
    tmp_path, monkeypatch, scontrol, slurm_env
):
    assert _node_run(tmp_path, monkeypatch, 0, _sigterm_to_self) == 128 + signal.SIGTERM
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "killed by signal 15 (SIGTERM)" in status["reason"]
    scontrol.set("COMPLETING", acct="CANCELLED by 0\n")
    assert _node_run(tmp_path, monkeypatch, -signal.SIGKILL) == 128 + signal.SIGKILL
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "cancelled"


# ----------------------------------------------------------------- the pieces
@pytest.mark.parametrize(
    "rc,job_state,terminated,asked,state,wait",
    [
        (0, "CANCELLED", True, True, None, 0),  # a trainer that finished wrote its own status
        (-9, "RUNNING", False, False, "failed", 0),  # kill -9 / OOM: nobody asked for a requeue
        (1, None, False, False, "failed", 0),  # scontrol unreachable: still no reason to wait
        (-15, "CANCELLED", True, False, "cancelled", 0),
        (-15, "REQUEUED", True, False, "requeued", 0),
        (-9, "PENDING", False, False, "requeued", 0),
        (-15, "TIMEOUT", True, False, "failed", 0),  # the job is ending and nobody requeues it
        (-15, None, True, False, "failed", 30),  # Slurm unreachable: the requeue signal may still come
        (-15, "RUNNING", False, True, "requeued", 0),  # the launcher's own requeue
        (-15, "RUNNING", True, False, "failed", 30),  # SIGTERM first: its requeue signal may follow
    ],
)
def test_settle_decides_from_the_exit_the_slurm_state_and_who_asked_for_a_requeue(
    rc, job_state, terminated, asked, state, wait
):
    outcome = S.settle(rc, job_state=job_state, terminated=terminated, requeue_asked=asked, requeue_wait_s=30)
    if state is None:
        assert outcome is None
    else:
        assert (outcome.state, outcome.wait_s) == (state, wait)


def test_exit_codes_and_signals_in_words():
    assert S.describe_exit(2) == "exited with code 2"
    assert S.describe_exit(-15) == "was killed by signal 15 (SIGTERM)"
    assert S.describe_exit(-9) == "was killed by signal 9 (SIGKILL, e.g. by the out-of-memory killer)"


def test_slurm_job_state_tells_a_cancel_from_a_requeue_while_both_are_completing(
    scontrol, monkeypatch, tmp_path
):
    # seen on the local cluster at the SIGTERM: scancel -> scontrol COMPLETING, Restarts=0, sacct
    # "CANCELLED by 0"; scontrol requeue -> COMPLETING, Restarts=1, sacct REQUEUED; scancel --signal=TERM
    # -> RUNNING
    scontrol.set("COMPLETING", acct="CANCELLED by 0\n")
    assert S.slurm_job_state("5", restart=0) == "CANCELLED"
    scontrol.set("COMPLETING", restarts=1, acct="REQUEUED\n")
    assert S.slurm_job_state("5", restart=0) == "REQUEUED"
    scontrol.set("COMPLETING", restarts=3, acct="")  # without accounting, the restart count tells
    assert S.slurm_job_state("5", restart=2) == "REQUEUED"
    scontrol.set("COMPLETING", restarts=1, acct="TIMEOUT\n")
    assert S.slurm_job_state("5", restart=1) == "TIMEOUT"
    scontrol.set("RUNNING", restarts=1)
    assert S.slurm_job_state("5", restart=1) == "RUNNING"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert S.slurm_job_state("5", restart=0) is None


def test_newest_checkpoint_step_follows_deepspeeds_latest_tag(tmp_path):
    assert S.newest_checkpoint_step(tmp_path) == 0
    for step in (3, 12, 9):
        (tmp_path / "_actor" / f"global_step{step}").mkdir(parents=True)
    (tmp_path / "_actor" / "best_global_step20").mkdir()
    assert S.newest_checkpoint_step(tmp_path) == 12
    (tmp_path / "_actor" / "latest").write_text("global_step9\n")  # what a restart loads
    assert S.newest_checkpoint_step(tmp_path) == 9


def test_status_is_replaced_atomically_and_keeps_the_trainers_max_steps(tmp_path):
    write_status(tmp_path, "running", 3, max_steps=10)
    status = S.record(S.Outcome("failed", "why"), tmp_path, tmp_path / "ckpt")
    assert status == json.loads((tmp_path / "status.json").read_text())
    assert {k: status[k] for k in ("state", "step", "max_steps", "reason")} == {
        "state": "failed",
        "step": 3,
        "max_steps": 10,
        "reason": "why",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temp file left


def test_the_status_dir_is_the_trainers_run_dir(tmp_path):
    cmd = C.build_train_command(["--dppo.run_dir", "rel/files"], run_dir=tmp_path / "out")
    assert cmd.status_dir == C.Path("rel/files").absolute() == C.run_files_dir(cmd.argv)
    assert C.build_train_command([], run_dir=tmp_path / "out").status_dir == tmp_path / "out"


# ------------------------------------------------------- one per-node flow for the submitit and sbatch paths
@pytest.mark.parametrize("rank", [0, 1])
def test_both_launchers_run_the_one_per_node_flow(tmp_path, monkeypatch, scontrol, slurm_env, rank):
    # run_node is the only place where rank 0 starts the head and the others join: both entry points
    # go through it (with a stand-in Ray), a worker returns without settling, task 0 settles its exit
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.delenv(R.LAUNCHED_ENV, raising=False)  # restored after the test
    calls = []
    launched = []  # what the Ray processes started here (and so every actor and the driver) would see

    def run_worker(rdv, **kwargs):
        launched.append(os.environ.get(R.LAUNCHED_ENV))
        calls.append(("worker", kwargs))

    monkeypatch.setattr(N, "run_worker", run_worker)

    def run_head(rdv, cmd, on_driver_exit, **kwargs):
        launched.append(os.environ.get(R.LAUNCHED_ENV))
        calls.append(("head", kwargs))
        on_driver_exit(3)  # the trainer failed with exit code 3, Ray still up
        return 3

    monkeypatch.setattr(N, "run_head", run_head)
    job = _job(tmp_path)
    _trainer_ran(job, last_step=2, ckpt_step=None)
    if rank == 0:
        with pytest.raises(RuntimeError, match="exited with code 3"):
            job()
    else:
        assert job() is None
    cmd = C.build_train_command([], run_dir=tmp_path / "run2", entry="x.py").argv
    assert N.main(["run", "--rendezvous-root", str(tmp_path / "rdv"), "--", *cmd]) == (3 if rank == 0 else 0)
    assert [c[0] for c in calls] == ["head" if rank == 0 else "worker"] * 2
    assert launched == ["1", "1"]  # a trainer under a launcher leaves the outcome to it
    if rank == 0:
        assert _status(job)["state"] == "failed"
        assert json.loads((tmp_path / "run2" / "status.json").read_text())["state"] == "failed"


def test_a_failure_keeps_what_the_interrupted_trainer_said(tmp_path):
    # The trainer of a launched run records "interrupted" when another Ray process of the run dies (a
    # cancel may kill it first); when the job was not being stopped the launcher's "failed" keeps the
    # trainer's words (which process died), after its own.
    R.write_status(
        tmp_path, "interrupted", 4, max_steps=10, reason="a Ray process of the run died (ActorDiedError: x)"
    )
    written = S.record(S.Outcome("failed", "the trainer exited with code 1"), tmp_path, tmp_path / "ckpt")
    assert written["state"] == "failed" and written["step"] == 4 and written["max_steps"] == 10
    assert written["reason"] == (
        "the trainer exited with code 1; the trainer said: a Ray process of the run died (ActorDiedError: x)"
    )
    written = S.record(S.Outcome("cancelled", "the job was cancelled"), tmp_path, tmp_path / "ckpt")
    assert written["reason"] == "the job was cancelled"  # only a failure needs the trainer's words
