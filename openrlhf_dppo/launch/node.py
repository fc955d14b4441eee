"""One Slurm task of a Ray job (one task per node): the per-node bootstrap of both ways to run on Slurm
(``launch.slurm.RayJob`` in its own process; slurm/dppo_ray.sbatch through srun). docs/SLURM.md.

      python -m openrlhf_dppo.launch.node run --rendezvous-root DIR [--join-timeout S] \\
          [--num-gpus G] [--num-cpus C] -- <training command>
      python -m openrlhf_dppo.launch.node mark-requeue --rendezvous-root DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from typing import Callable

from openrlhf_dppo.launch.command import get_flag, run_files_dir
from openrlhf_dppo.launch.ray_cluster import Rendezvous, free_port, run_head, run_worker
from openrlhf_dppo.launch.status import Outcome, record, settle, slurm_job_state
from openrlhf_dppo.run_dir import LAUNCHED_ENV


@dataclass(frozen=True)
class SlurmTask:
    """Who this task is, from the variables Slurm sets for every task."""

    job_id: str
    restart: int  # SLURM_RESTART_COUNT: how often the job was requeued
    rank: int
    num_nodes: int
    cpus: int | None  # CPUs Slurm allocated on this node

    @classmethod
    def from_env(cls, environ=None) -> SlurmTask:
        env = os.environ if environ is None else environ
        if "SLURM_JOB_ID" not in env:
            raise RuntimeError("not in a Slurm job (SLURM_JOB_ID is unset): start it with sbatch / srun")
        cpus = env.get("SLURM_CPUS_ON_NODE", "")
        return cls(
            job_id=env["SLURM_JOB_ID"],
            restart=int(env.get("SLURM_RESTART_COUNT") or 0),
            rank=int(env.get("SLURM_PROCID") or 0),
            num_nodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
            cpus=int(cpus) if cpus.isdigit() else None,
        )


def prepare(task: SlurmTask, rendezvous_root, temp_root="/tmp") -> Rendezvous:
    """The task's rendezvous, after removing the Ray temp dirs earlier restarts left on this node."""
    rdv = Rendezvous.for_job(rendezvous_root, task.job_id, task.restart, temp_root)
    for path in rdv.remove_stale_temp_dirs():
        print(f"[dppo-launch] removed {path}, left by an earlier run of job {task.job_id}", flush=True)
    return rdv


def report(outcome: Outcome, run_dir, ckpt_path) -> None:
    """Record the outcome in status.json and say so in the task's log."""
    status = record(outcome, run_dir, ckpt_path)
    print(
        f"[dppo-launch] run marked {status['state']} at step {status['step']}: {outcome.reason}", flush=True
    )


def chain_sigterm(note) -> None:
    """Call `note()` on SIGTERM, then the handler installed before (submitit's, which ignores it)."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        note()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)


@dataclass(frozen=True)
class NodeEnd:
    """How task 0's trainer ended: its exit code (as ``decide`` returned it), what that means (None: it
    finished) and whether it is recorded in status.json already."""

    rc: int
    outcome: Outcome | None
    recorded: bool


def run_node(
    task: SlurmTask,
    rdv: Rendezvous,
    argv: list[str],
    *,
    num_cpus: int | None,
    num_gpus: int,
    join_timeout_s: float,
    port: int | None,
    decide: Callable[[int], tuple[int, Outcome | None]],
    record: Callable[[Outcome], None],
    on_head_start: Callable | None = None,
    on_driver_start: Callable | None = None,
) -> NodeEnd | None:
    """Rank 0 starts the Ray head and runs the trainer; every other rank joins and returns None when
    the head's Ray stops. When the trainer exits, before Ray stops, ``decide(rc)`` gives the outcome and
    ``record`` records it, unless ``outcome.wait_s > 0`` (the caller waits and records). A
    ``Terminated`` raised by the caller's SIGTERM handler counts as an exit by SIGTERM.
    """
    # every process started from here knows a launcher records the outcome (run_dir.LAUNCHED_ENV)
    os.environ[LAUNCHED_ENV] = "1"
    if task.rank != 0:
        run_worker(rdv, num_cpus=num_cpus, num_gpus=num_gpus, join_timeout_s=join_timeout_s)
        return None
    ended: list[NodeEnd] = []

    def driver_exited(code: int) -> None:
        rc, outcome = decide(code)
        recorded = outcome is not None and outcome.wait_s == 0
        if recorded:
            record(outcome)
        ended.append(NodeEnd(rc, outcome, recorded))

    try:
        rc = run_head(
            rdv,
            argv,
            num_nodes=task.num_nodes,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            port=port or free_port(),
            join_timeout_s=join_timeout_s,
            on_head_start=on_head_start,
            on_driver_start=on_driver_start,
            on_driver_exit=driver_exited,
        )
    except Terminated:
        rc = -signal.SIGTERM  # run_head's teardown stopped the trainer
    if ended:
        return ended[0]
    rc, outcome = decide(rc)  # the trainer never started, or its exit was not seen
    return NodeEnd(rc, outcome, False)


class Terminated(Exception):
    """The task got SIGTERM (raised once, from the handler, to unwind into the teardown)."""


def _raise_once(state: dict):
    def handler(signum, frame):
        if not state.get("terminated"):
            state["terminated"] = True
            raise Terminated

    return handler


def run(args: argparse.Namespace) -> int:
    task = SlurmTask.from_env()
    rdv = prepare(task, args.rendezvous_root)
    num_gpus = args.num_gpus if args.num_gpus is not None else int(os.environ.get("SLURM_GPUS_ON_NODE") or 0)
    num_cpus = args.num_cpus or task.cpus
    state: dict = {}
    signal.signal(signal.SIGTERM, _raise_once(state))
    print(
        f"[dppo-launch] job {task.job_id} restart {task.restart} task {task.rank}/{task.num_nodes}",
        flush=True,
    )
    run_dir = run_files_dir(args.command)
    ckpt = get_flag(args.command, "--ckpt.path")

    def decide(rc: int) -> tuple[int, Outcome | None]:
        if state.get("terminated"):
            rc = -signal.SIGTERM  # the teardown stopped the trainer (or it died of the same SIGTERM)
        return rc, settle(
            rc,
            job_state=slurm_job_state(task.job_id, task.restart) if rc != 0 else None,
            terminated=bool(state.get("terminated")),
            requeue_asked=rdv.requeue_requested(),
            requeue_wait_s=0.0,  # the batch script requeues by itself (mark-requeue first)
        )

    def record(outcome: Outcome) -> None:
        if run_dir is not None and ckpt:
            report(outcome, run_dir, ckpt)
        else:
            print(f"[dppo-launch] {outcome.state}: {outcome.reason}", flush=True)

    try:
        end = run_node(
            task,
            rdv,
            args.command,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            join_timeout_s=args.join_timeout,
            port=None,
            decide=decide,
            record=record,
        )
    except Terminated:  # only a worker gets here: run_node stops task 0's head on it
        return 128 + signal.SIGTERM
    if end is None or end.outcome is None:
        return 0
    if not end.recorded:
        record(end.outcome)
    return 0 if end.outcome.state == "requeued" else (end.rc if end.rc > 0 else 128 - end.rc)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openrlhf_dppo.launch.node", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="this node's part of the job (srun starts one per node)")
    m = sub.add_parser("mark-requeue", help="tell task 0 that the job is being requeued (before stopping it)")
    for q in (r, m):
        q.add_argument(
            "--rendezvous-root", required=True, help="folder shared by the nodes (<run dir>/slurm)"
        )
    r.add_argument("--join-timeout", type=float, default=300.0, help="seconds to wait for all nodes to join")
    r.add_argument(
        "--num-gpus", type=int, default=None, help="GPUs Ray advertises (default SLURM_GPUS_ON_NODE)"
    )
    r.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs Ray advertises (default SLURM_CPUS_ON_NODE)"
    )
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command (run on task 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "mark-requeue":
        task = SlurmTask.from_env()
        Rendezvous.for_job(args.rendezvous_root, task.job_id, task.restart).request_requeue()
        return 0
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        build_parser().error("run: give the training command after --")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
