"""The training command of a Slurm job: an experiment recipe's flags plus
``--ckpt.load_enable --ckpt.path <ckpt>`` and a positive ``--ckpt.save_steps``, so that any restart
resumes from the newest checkpoint.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ENTRY = "openrlhf_dppo.cli.train_dppo_ray"
DEFAULT_SAVE_STEPS = 10


def load_experiment(path: str | os.PathLike, *, nodes: int, gpus_per_node: int) -> tuple[str, list[str]]:
    """(entry module, training flags) of an experiment recipe, with NNODES / GPUS_PER_NODE set from the
    allocation (0 GPUs keeps the recipe's)."""
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
    run_dir: Path  # --ckpt.output_dir
    ckpt_path: Path  # --ckpt.path

    @property
    def status_dir(self) -> Path:
        """Where the trainer writes metrics.jsonl and status.json: --dppo.run_dir, else the run dir."""
        return run_files_dir(self.argv) or self.run_dir


def run_files_dir(argv: list[str]) -> Path | None:
    """The trainer's run directory (metrics.jsonl, status.json) named by a training command line."""
    value = get_flag(argv, "--dppo.run_dir") or get_flag(argv, "--ckpt.output_dir")
    return Path(value).absolute() if value else None


def build_train_command(
    config_argv: list[str],
    *,
    run_dir: str | os.PathLike | None = None,
    save_steps: int = DEFAULT_SAVE_STEPS,
    entry: str = DEFAULT_ENTRY,
    python: str = sys.executable,
) -> TrainCommand:
    """The training command with the flags that make every restart resume from the newest checkpoint.

    run_dir: `--ckpt.output_dir` (default: the recipe's, else runs/slurm). The checkpoint folder is the
    recipe's `--ckpt.path`, else `<run_dir>/ckpt`. A recipe that never saves gets `save_steps`. Paths
    are made absolute. ValueError for `save_steps` <= 0.
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
    files_dir = get_flag(argv, "--dppo.run_dir")
    if files_dir:
        argv = set_flag(argv, "--dppo.run_dir", str(Path(files_dir).absolute()))
    head = [python, str(Path(entry).absolute())] if entry.endswith(".py") else [python, "-m", entry]
    return TrainCommand(argv=head + argv, run_dir=run_dir, ckpt_path=ckpt_path)
