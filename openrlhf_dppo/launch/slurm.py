"""Run a DPPO (or GRPO) experiment on a Slurm allocation through submitit, surviving preemption.

    python -m openrlhf_dppo.launch.slurm --config configs/<exp>.yaml --nodes 2 --gpus-per-node 8 \
        [--partition P --account A --qos Q --time 1-00:00:00] [--dry-run] [-- <extra training flags>]

The whole behaviour: docs/SLURM.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import submitit

from openrlhf_dppo.launch.command import (
    DEFAULT_SAVE_STEPS,
    TrainCommand,
    build_train_command,
    load_experiment,
)
from openrlhf_dppo.launch.node import SlurmTask, chain_sigterm, prepare, report, run_node
from openrlhf_dppo.launch.procs import terminate_group
from openrlhf_dppo.launch.resources import SlurmResources, parse_time_minutes, sbatch_script
from openrlhf_dppo.launch.status import Outcome, settle, slurm_job_state
from openrlhf_dppo.run_dir import read_metrics  # the one reader of metrics.jsonl (job_summary, tests)


class SubmissionError(RuntimeError):
    """Slurm refused the job (bad partition, account, QoS, impossible resource request, ...)."""


class RayJob(submitit.helpers.Checkpointable):
    """The callable submitit runs in every task (one per node). Checkpointable: on the forwarded signal
    it stops the trainer and asks to be requeued as is; the training command resumes by itself."""

    def __init__(
        self,
        command: TrainCommand,
        *,
        gpus_per_node: int = 0,
        join_timeout_s: float = 300.0,
        ray_port: int | None = None,
        stop_grace_s: float = 60.0,
        ray_num_gpus: int | None = None,
        ray_num_cpus: int | None = None,
        requeue_wait_s: float = 60.0,
    ):
        self.command = command
        self.ray_num_cpus = ray_num_cpus
        self.ray_num_gpus = gpus_per_node if ray_num_gpus is None else ray_num_gpus
        self.join_timeout_s = join_timeout_s
        self.ray_port = ray_port
        self.stop_grace_s = stop_grace_s
        self.requeue_wait_s = requeue_wait_s
        self._reset()

    # this run's state (task 0), not part of a resubmission: the Ray head's and the trainer's processes,
    # whether checkpoint() ran (submitit requeues the job and exits) and whether the task got SIGTERM
    _RUN_STATE = dict(_head=None, _driver=None, _requeue_asked=False, _terminated=False)

    def _reset(self) -> None:
        self.__dict__.update(self._RUN_STATE)

    def __getstate__(self):
        return {**self.__dict__, **self._RUN_STATE}

    def __call__(self) -> dict | None:
        env = submitit.JobEnvironment()
        task = SlurmTask.from_env()
        rdv = prepare(task, env.paths.folder)
        num_cpus = self.ray_num_cpus or task.cpus
        print(
            f"[dppo-launch] {env} restart={task.restart} cpus={num_cpus} gpus={self.ray_num_gpus}", flush=True
        )
        if task.rank == 0:
            self._reset()
            chain_sigterm(lambda: setattr(self, "_terminated", True))
        end = run_node(
            task,
            rdv,
            self.command.argv,
            num_cpus=num_cpus,
            num_gpus=self.ray_num_gpus,
            join_timeout_s=self.join_timeout_s,
            port=self.ray_port,
            decide=lambda code: self._decide(task, code),
            record=self._record,
            on_head_start=lambda proc: setattr(self, "_head", proc),
            on_driver_start=lambda proc: setattr(self, "_driver", proc),
        )
        if end is None:  # a worker: the head's Ray has stopped
            return None
        outcome, recorded = end.outcome, end.recorded
        if outcome is None:
            return job_summary(self.command.status_dir, job_id=task.job_id, restarts=task.restart)
        if outcome.wait_s > 0:
            print(f"[dppo-launch] {outcome.reason} yet: waiting {outcome.wait_s:.0f}s for it", flush=True)
            time.sleep(outcome.wait_s)  # the requeue signal's handler (checkpoint) exits from here
            outcome = dataclasses.replace(outcome, reason=f"{outcome.reason} within {outcome.wait_s:.0f}s")
        if not recorded:
            self._report(outcome)
        if outcome.state == "requeued":  # by Slurm: the job restarts; this run leaves no result
            sys.exit(1)
        raise RuntimeError(
            f"{outcome.reason} (its output is in {env.paths.stdout}): {shlex.join(self.command.argv)}"
        )

    def _decide(self, task: SlurmTask, rc: int) -> tuple[int, Outcome | None]:
        self._driver = None
        return rc, settle(
            rc,
            job_state=slurm_job_state(task.job_id, task.restart) if rc != 0 else None,
            terminated=self._terminated,
            requeue_asked=self._requeue_asked,
            requeue_wait_s=self.requeue_wait_s,
        )

    def _record(self, outcome: Outcome) -> None:
        if not self._requeue_asked:  # checkpoint() stopped the trainer and has recorded the requeue
            self._report(outcome)

    def _report(self, outcome: Outcome) -> None:
        report(outcome, self.command.status_dir, self.command.ckpt_path)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit (task 0) on the preemption / time-limit signal, before it requeues the job:
        stops the trainer, then Ray, and marks the run requeued."""
        self._requeue_asked = True
        driver, head, self._driver, self._head = self._driver, self._head, None, None
        # this runs in a signal handler that interrupted driver.wait(): poll, never wait on a child
        if driver is not None:
            print(
                f"[dppo-launch] signal received: stopping the trainer (grace {self.stop_grace_s:.0f}s)",
                flush=True,
            )
            terminate_group(driver.pid, self.stop_grace_s)
        if head is not None:
            terminate_group(head.pid, 20.0)
        self._report(Outcome("requeued", "the launcher stopped the trainer and requeued the job"))
        # submitit runs `scontrol requeue` next, as a child; the requeue's SIGTERM could kill it before it
        # exits, and submitit would fail the run. SIG_IGN survives exec: scontrol finishes.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def job_summary(run_dir: str | os.PathLike, *, job_id: str, restarts: int) -> dict:
    """What the job returns: where the run is, and its training metrics (DESIGN.md: metrics.jsonl)."""
    train = [m for m in read_metrics(run_dir) if m.get("kind", "train") == "train"]
    return {
        "job_id": job_id,
        "restarts": restarts,
        "run_dir": str(run_dir),
        "steps": [m.get("step") for m in train],
        "last_train": train[-1] if train else None,
    }


def submit(
    command: TrainCommand,
    resources: SlurmResources,
    *,
    log_dir: str | os.PathLike | None = None,
    max_requeue: int = 3,
    **job,
):
    """Submit the job; returns the submitit Job. ``job``: ``RayJob``'s keyword arguments but
    ``gpus_per_node`` (the resources'). Raises SubmissionError when Slurm refuses it."""
    from submitit.core.utils import FailedJobError

    folder = Path(log_dir) if log_dir is not None else command.run_dir / "slurm"
    executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=max_requeue)
    executor.update_parameters(**resources.submitit_parameters())
    job_fn = RayJob(command, gpus_per_node=resources.gpus_per_node, **job)
    try:
        return executor.submit(job_fn)
    except FailedJobError as e:  # submitit's wrapper around a failed `sbatch`
        msg = str(e).strip() or repr(e)
        raise SubmissionError(f"Slurm refused the job: {msg}") from None


# ---------------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openrlhf_dppo.launch.slurm",
        description="Run a DPPO/GRPO experiment on Slurm (Ray across nodes, requeue + resume on preemption).",
        epilog="Flags after `--` are appended to the training command (they override the config).",
    )
    g = p.add_argument_group("experiment")
    g.add_argument("--config", required=True, help="experiment config (configs/<exp>.yaml)")
    g.add_argument("--run-dir", default=None, help="run directory (--ckpt.output_dir); default: the config's")
    g.add_argument(
        "--entry", default=None, help="training module (or .py script) run on the head; default: the config's"
    )
    g.add_argument(
        "--save-steps",
        type=int,
        default=DEFAULT_SAVE_STEPS,
        help="--ckpt.save_steps when the config does not save checkpoints (needed to resume)",
    )
    s = p.add_argument_group("slurm")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=8, help="0 for a CPU-only job (no gres requested)")
    s.add_argument(
        "--cpus-per-task", type=int, default=None, help="CPUs of the node's one task (Ray uses them)"
    )
    s.add_argument("--mem-gb", type=float, default=None)
    s.add_argument("--time", default="24:00:00", help="time limit: minutes, HH:MM:SS or D-HH:MM:SS")
    s.add_argument("--partition")
    s.add_argument("--account")
    s.add_argument("--qos")
    s.add_argument("--constraint")
    s.add_argument("--exclusive", action="store_true")
    s.add_argument("--job-name", default=None, help="default: dppo-<config name>")
    s.add_argument("--setup", action="append", default=[], help="shell line run before srun (repeatable)")
    s.add_argument("--sbatch", action="append", default=[], help="extra sbatch option KEY=VALUE (repeatable)")
    s.add_argument("--log-dir", default=None, help="submitit/Slurm logs; default <run-dir>/slurm/<job id>")
    r = p.add_argument_group("ray and preemption")
    r.add_argument("--join-timeout", type=float, default=300.0, help="seconds to wait for all nodes to join")
    r.add_argument(
        "--ray-num-gpus",
        type=int,
        default=None,
        help="GPUs each Ray node advertises (default --gpus-per-node); on CPU-only nodes the number of "
        "stand-in GPU resources the CPU pipeline schedules on (openrlhf_dppo.compat.cpu uses 4)",
    )
    r.add_argument(
        "--ray-num-cpus",
        type=int,
        default=None,
        help="CPUs each Ray node advertises (default: the CPUs Slurm allocated on the node)",
    )
    r.add_argument("--ray-port", type=int, default=None, help="GCS port of the head (default: a free port)")
    r.add_argument("--signal-delay", type=int, default=90, help="seconds before the limit to get the signal")
    r.add_argument(
        "--stop-grace", type=float, default=60.0, help="seconds the trainer gets to stop on the signal"
    )
    r.add_argument(
        "--requeue-wait",
        type=float,
        default=60.0,
        help="after a SIGTERM to the job kills the trainer while Slurm keeps the job running (a preemption "
        "whose requeue signal is on its way), seconds to wait for that signal before marking the run failed",
    )
    r.add_argument(
        "--max-requeue", type=int, default=3, help="requeues after time limits (preemptions: unlimited)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the sbatch script and the command, submit nothing"
    )
    p.add_argument("--wait", action="store_true", help="wait for the job and print its result")
    p.add_argument(
        "--print-command",
        action="store_true",
        help="print the run dir and the training command, NUL-separated (used by slurm/dppo_ray.sbatch)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    try:
        sbatch_extra = dict(kv.split("=", 1) for kv in args.sbatch)
    except ValueError:
        print(f"error: --sbatch takes KEY=VALUE, got {args.sbatch}", file=sys.stderr)
        return 2
    try:
        entry, flags = load_experiment(args.config, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
        command = build_train_command(
            flags + extra, run_dir=args.run_dir, save_steps=args.save_steps, entry=args.entry or entry
        )
        as_given = ("nodes", "gpus_per_node", "cpus_per_task", "mem_gb", "partition", "account", "qos")
        resources = SlurmResources(
            **{k: getattr(args, k) for k in (*as_given, "constraint", "exclusive")},
            time_min=parse_time_minutes(args.time),
            job_name=args.job_name or f"dppo-{Path(args.config).stem}",
            signal_delay_s=args.signal_delay,
            setup=tuple(args.setup),
            extra=sbatch_extra,
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir).absolute() if args.log_dir else command.run_dir / "slurm"
    if args.print_command:
        sys.stdout.write("\0".join([str(command.run_dir), *command.argv]) + "\0")
        return 0
    if args.dry_run:
        print("# sbatch script (submitit writes it to the job folder):")
        print(sbatch_script(resources, log_dir / "%j"))
        print("# training command (task 0, after all nodes joined Ray):")
        print(shlex.join(command.argv))
        return 0
    try:
        job = submit(
            command,
            resources,
            log_dir=log_dir,
            join_timeout_s=args.join_timeout,
            ray_port=args.ray_port,
            stop_grace_s=args.stop_grace,
            max_requeue=args.max_requeue,
            ray_num_gpus=args.ray_num_gpus,
            ray_num_cpus=args.ray_num_cpus,
            requeue_wait_s=args.requeue_wait,
        )
    except SubmissionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"submitted job {job.job_id}")
    print(f"  logs:    {job.paths.stdout}  {job.paths.stderr}")
    print(f"  run dir: {command.run_dir}")
    if not args.wait:
        return 0
    signal.signal(signal.SIGINT, signal.default_int_handler)
    result = job.results()[0]  # task 0's summary (one task per node)
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
