"""The Slurm side of a job: its time limit and resources as submitit / sbatch parameters (every job
`--requeue`; no gres at all without GPUs).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field


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
        for k in ("cpus_per_task", "partition", "account", "qos", "constraint"):
            if getattr(self, k) is not None:
                params[k] = getattr(self, k)
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
