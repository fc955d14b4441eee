"""Run a DPPO (or GRPO) experiment on a Slurm allocation through submitit, surviving preemption.

    python -m openrlhf_dppo.launch.slurm --config configs/<exp>.yaml --nodes 2 --gpus-per-node 8 \
        [--partition P --account A --qos Q --time 1-00:00:00] [--dry-run] [-- <extra training flags>]

1. One Slurm task per node; task 0 starts the Ray head, the others join it (`ray_cluster`); task 0
   waits for all nodes (timeout -> readable error), then runs `openrlhf_dppo.cli.train_dppo_ray` with the
   config's flags, and everyone stops its own Ray processes.
2. The training command always carries `--ckpt.load_enable --ckpt.path <ckpt>` and a positive
   `--ckpt.save_steps`, so any restart of the job (requeue after preemption or time limit, node
   failure, a manual resubmission) resumes from the newest checkpoint: weights, optimizer, dataloader
   position and the DPPO prompt history (saved in the checkpoint's client_states by the trainer).
3. On the signal submitit forwards before a preemption or the time limit (USR2, `--signal-delay`
   seconds ahead), `RayJob.checkpoint` stops the trainer with SIGTERM (a trainer that saves on SIGTERM
   gets `--stop-grace` seconds to do so), then submitit requeues the job (`scontrol requeue`).

A job without GPUs (`--gpus-per-node 0`, the tiny CPU job) requests no gres at all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import submitit

from openrlhf_dppo.launch.ray_cluster import Rendezvous, free_port, run_head, run_worker, terminate_group

DEFAULT_ENTRY = "openrlhf_dppo.cli.train_dppo_ray"
DEFAULT_SAVE_STEPS = 10


class SubmissionError(RuntimeError):
    """Slurm refused the job (bad partition, account, QoS, impossible resource request, ...)."""


# ---------------------------------------------------------------------------------------------------
# experiment config -> training argv


def load_experiment(path: str | os.PathLike, *, nodes: int, gpus_per_node: int) -> tuple[str, list[str]]:
    """(entry module, training flags) of an experiment config (openrlhf_dppo/recipe.py format).

    The config's NNODES / GPUS_PER_NODE variables follow the allocation (a CPU job, 0 GPUs, keeps the
    config's own value), like any variable set in the environment."""
    from openrlhf_dppo.recipe import load_command

    environ = dict(os.environ, NNODES=str(nodes))
    if gpus_per_node > 0:
        environ["GPUS_PER_NODE"] = str(gpus_per_node)
    cmd = load_command(str(path), environ)  # [python, "-m", entry, *flags]
    return cmd[2], cmd[3:]


def get_flag(argv: list[str], name: str) -> str | None:
    """Value of the last `--name value` / `--name=value` in argv ("" for a bare flag), None if absent."""
    value = None
    for i, tok in enumerate(argv):
        if tok == name:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else ""
        elif tok.startswith(name + "="):
            value = tok[len(name) + 1 :]
    return value


def set_flag(argv: list[str], name: str, value: str | None) -> list[str]:
    """argv without any `name` occurrence, then `name value` (or the bare flag when value is None)."""
    out: list[str] = []
    skip = False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
            continue
        if tok == name:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = nxt is not None and not nxt.startswith("--")
            continue
        if tok.startswith(name + "="):
            continue
        out.append(tok)
    return out + ([name] if value is None else [name, str(value)])


@dataclass(frozen=True)
class TrainCommand:
    argv: list[str]  # full command line run on the head node
    run_dir: Path
    ckpt_path: Path


def build_train_command(
    config_argv: list[str],
    *,
    run_dir: str | os.PathLike | None = None,
    save_steps: int = DEFAULT_SAVE_STEPS,
    entry: str = DEFAULT_ENTRY,
    python: str = sys.executable,
) -> TrainCommand:
    """The training command with the flags that make every restart resume from the newest checkpoint.

    run_dir: `--ckpt.output_dir` (overrides the config's when given; defaults to it, else runs/slurm).
    The checkpoint folder is the config's `--ckpt.path`, else `<run_dir>/ckpt`. A config that never
    saves (`--ckpt.save_steps` absent or <= 0) gets `save_steps`: without checkpoints a requeued job
    would start over.
    """
    if save_steps <= 0:
        raise ValueError(f"save_steps must be positive so that a requeued job can resume, got {save_steps}")
    argv = list(config_argv)
    if run_dir is None:
        run_dir = get_flag(argv, "--ckpt.output_dir") or "runs/slurm"
    run_dir = Path(run_dir).absolute()
    argv = set_flag(argv, "--ckpt.output_dir", str(run_dir))
    ckpt = get_flag(argv, "--ckpt.path")
    ckpt_path = Path(ckpt).absolute() if ckpt else run_dir / "ckpt"
    argv = set_flag(argv, "--ckpt.path", str(ckpt_path))
    argv = set_flag(argv, "--ckpt.load_enable", None)
    configured = get_flag(argv, "--ckpt.save_steps")
    if not configured or int(configured) <= 0:
        argv = set_flag(argv, "--ckpt.save_steps", str(save_steps))
    head = [python, str(Path(entry).absolute())] if entry.endswith(".py") else [python, "-m", entry]
    return TrainCommand(argv=head + argv, run_dir=run_dir, ckpt_path=ckpt_path)


# ---------------------------------------------------------------------------------------------------
# Slurm resources -> submitit / sbatch parameters


def parse_time_minutes(value: str | int) -> int:
    """Slurm time ("MM", "HH:MM:SS", "D-HH[:MM[:SS]]", or minutes as int) -> whole minutes (rounded up)."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if m is None:
        raise ValueError(f"cannot read Slurm time {value!r} (use MM, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is None and b is None:  # "MM"
        return a
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = a, b or 0, c or 0
    elif c is None:  # MM:SS
        hours, minutes, seconds = 0, a, b
    else:  # HH:MM:SS
        hours, minutes, seconds = a, b, c
    total_s = (((days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_s // 60)


@dataclass(frozen=True)
class SlurmResources:
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None  # CPUs for the one task of a node (Ray gets all of them)
    mem_gb: float | None = None
    time_min: int = 60
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    job_name: str = "dppo"
    signal_delay_s: int = 90
    setup: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)  # any other sbatch option, e.g. {"reservation": "x"}

    def __post_init__(self):
        if self.nodes < 1:
            raise ValueError(f"--nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise ValueError(f"--gpus-per-node must be >= 0 (0 = a CPU-only job), got {self.gpus_per_node}")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise ValueError(f"--cpus-per-task must be >= 1, got {self.cpus_per_task}")
        # submitit signals USR2 `signal_delay_s` before the end: a shorter job would be signalled at start
        if self.time_min * 60 <= self.signal_delay_s + 60:
            raise ValueError(
                f"--time {self.time_min} min leaves no time to train: the preemption signal comes "
                f"{self.signal_delay_s}s before the limit (raise --time or lower --signal-delay)"
            )

    def submitit_parameters(self) -> dict:
        """Keyword arguments for submitit.SlurmExecutor.update_parameters."""
        params: dict = {
            "job_name": self.job_name,
            "nodes": self.nodes,
            "ntasks_per_node": 1,
            "time": self.time_min,
            "signal_delay_s": self.signal_delay_s,
        }
        if self.gpus_per_node > 0:  # a CPU-only partition rejects any gres request, even gpu:0
            params["gpus_per_node"] = self.gpus_per_node
        optional = {
            "cpus_per_task": self.cpus_per_task,
            "partition": self.partition,
            "account": self.account,
            "qos": self.qos,
            "constraint": self.constraint,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        if self.mem_gb is not None:
            params["mem"] = (
                f"{int(self.mem_gb)}GB" if self.mem_gb == int(self.mem_gb) else f"{int(self.mem_gb * 1024)}MB"
            )
        if self.exclusive:
            params["exclusive"] = True
        if self.setup:
            params["setup"] = list(self.setup)
        # requeue (not cancel) the job when Slurm preempts it or its node fails
        params["additional_parameters"] = {"requeue": True, **self.extra}
        return params


def sbatch_script(resources: SlurmResources, folder: str | os.PathLike, python: str = sys.executable) -> str:
    """The sbatch file submitit will write for this job (shown by --dry-run)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = resources.submitit_parameters()
    command = " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, **params)


# ---------------------------------------------------------------------------------------------------
# the job


class RayJob(submitit.helpers.Checkpointable):
    """The callable submitit runs in every task (one per node). Checkpointable: on the forwarded signal
    it stops the trainer and asks to be requeued as is; the training command resumes by itself."""

    def __init__(
        self,
        command: list[str],
        run_dir: str | os.PathLike,
        *,
        gpus_per_node: int = 0,
        join_timeout_s: float = 300.0,
        ray_port: int | None = None,
        stop_grace_s: float = 60.0,
        ray_num_gpus: int | None = None,
        ray_num_cpus: int | None = None,
    ):
        self.command = list(command)
        self.ray_num_cpus = ray_num_cpus
        self.ray_num_gpus = gpus_per_node if ray_num_gpus is None else ray_num_gpus
        self.run_dir = str(run_dir)
        self.gpus_per_node = gpus_per_node
        self.join_timeout_s = join_timeout_s
        self.ray_port = ray_port
        self.stop_grace_s = stop_grace_s
        self._driver: subprocess.Popen | None = None

    def __getstate__(self):  # the running trainer's handle is not part of the requeued submission
        state = dict(self.__dict__)
        state["_driver"] = None
        return state

    def __call__(self) -> dict | None:
        env = submitit.JobEnvironment()
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        rdv = Rendezvous.for_job(env.paths.folder, str(env.job_id), restart)
        num_cpus = self.ray_num_cpus or _slurm_cpus_on_node()
        print(f"[dppo-launch] {env} restart={restart} cpus={num_cpus} gpus={self.ray_num_gpus}", flush=True)
        if env.global_rank != 0:
            run_worker(rdv, num_cpus=num_cpus, num_gpus=self.ray_num_gpus, join_timeout_s=self.join_timeout_s)
            return None
        rc = run_head(
            rdv,
            self.command,
            num_nodes=env.num_nodes,
            num_cpus=num_cpus,
            num_gpus=self.ray_num_gpus,
            port=self.ray_port or free_port(),
            join_timeout_s=self.join_timeout_s,
            on_driver_start=self._set_driver,
        )
        self._driver = None
        if rc != 0:
            raise RuntimeError(
                f"the training command exited with code {rc} (its output is in {env.paths.stdout}): "
                f"{shlex.join(self.command)}"
            )
        return job_summary(self.run_dir, job_id=str(env.job_id), restarts=restart)

    def _set_driver(self, proc: subprocess.Popen) -> None:
        self._driver = proc

    def checkpoint(self, *args, **kwargs):
        """Called by submitit (task 0) on the preemption / time-limit signal, before it requeues the job."""
        driver, self._driver = self._driver, None
        if driver is not None:
            # this runs in a signal handler that interrupted driver.wait(): poll, never wait on it
            print(
                f"[dppo-launch] signal received: stopping the trainer (grace {self.stop_grace_s:.0f}s)",
                flush=True,
            )
            terminate_group(driver.pid, self.stop_grace_s)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _slurm_cpus_on_node() -> int | None:
    value = os.environ.get("SLURM_CPUS_ON_NODE")
    return int(value) if value and value.isdigit() else None


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
    return lines


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
    join_timeout_s: float = 300.0,
    ray_port: int | None = None,
    stop_grace_s: float = 60.0,
    max_requeue: int = 3,
    ray_num_gpus: int | None = None,
    ray_num_cpus: int | None = None,
):
    """Submit the job; returns the submitit Job. Raises SubmissionError when Slurm refuses it."""
    from submitit.core.utils import FailedJobError

    folder = Path(log_dir) if log_dir is not None else command.run_dir / "slurm"
    executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=max_requeue)
    executor.update_parameters(**resources.submitit_parameters())
    job_fn = RayJob(
        command.argv,
        command.run_dir,
        gpus_per_node=resources.gpus_per_node,
        join_timeout_s=join_timeout_s,
        ray_port=ray_port,
        stop_grace_s=stop_grace_s,
        ray_num_gpus=ray_num_gpus,
        ray_num_cpus=ray_num_cpus,
    )
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
        resources = SlurmResources(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            cpus_per_task=args.cpus_per_task,
            mem_gb=args.mem_gb,
            time_min=parse_time_minutes(args.time),
            partition=args.partition,
            account=args.account,
            qos=args.qos,
            constraint=args.constraint,
            exclusive=args.exclusive,
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
