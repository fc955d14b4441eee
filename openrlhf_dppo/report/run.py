"""One run directory, parsed (file names and keys: ``openrlhf_dppo.run_dir``). ``load_run(path)`` raises
:class:`RunDirError` naming what is missing: the directory, ``run_config.json``, or ``metrics.jsonl``
unless status.json says the run is in progress; ``status.json`` and ``eval_results.json`` are optional.
A run_config.json written before ``--dppo.method`` is read as dppo/grpo (``upgrade_config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.run_dir import EVAL_RESULTS, METRICS, RUN_CONFIG, STATUS, RunDirError, number
from openrlhf_dppo.run_dir import read_json_object as _read_json

__all__ = [
    "Run",
    "RunDirError",
    "load_run",
    "number",
    "run_names",
    "series",
    "stopped_early",
    "upgrade_config",
]


@dataclass
class Run:
    """One run directory, parsed. ``train`` / ``evals``: the kind=train / kind=eval metric lines, one per
    step (the last), sorted by step. ``state``: status.json's, "running" without one. ``notes``: what was
    tolerated while reading (a partial last line, repeated steps)."""

    name: str
    path: Path
    config: dict[str, Any]
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    status: dict[str, Any] | None
    eval_results: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.status is None:
            return "running"
        return str(self.status.get("state", "running"))

    @property
    def in_progress(self) -> bool:
        return self.state in R.IN_PROGRESS

    @property
    def algo(self) -> str:
        algo = self.config.get("algo") or (self.config.get("dppo") or {}).get("method")
        return str(algo) if algo else "grpo"

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a training metric over the steps that carry it as a finite number."""
        return series(self.train, key)

    def eval_curves(self) -> dict[str, tuple[list[int], list[float]]]:
        """{benchmark: (steps, pass@1)} from the in-training eval lines (OpenRLHF's eval_<name>_pass1)."""
        curves: dict[str, tuple[list[int], list[float]]] = {}
        for row in self.evals:
            for key, value in row.items():
                dataset = R.pass1_dataset(key)
                if dataset is not None and number(value) is not None:
                    steps, values = curves.setdefault(dataset, ([], []))
                    steps.append(int(row[R.STEP]))
                    values.append(float(value))
        return dict(sorted(curves.items()))

    def has(self, key: str) -> bool:
        return any(key in row for row in self.train)

    def describe_state(self) -> str:
        if not self.in_progress:
            return self.state
        done = self.train[-1]["step"] if self.train else 0
        total = (self.status or {}).get("max_steps")
        what = "in progress" if self.state == "running" else self.state
        return f"{what} (step {done}/{total})" if total else f"{what} (step {done})"


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` over the rows that carry it as a finite number."""
    steps, values = [], []
    for row in rows:
        value = number(row.get(key))
        if value is not None:
            steps.append(int(row["step"]))
            values.append(value)
    return steps, values


def _read_metrics(path: Path, notes: list[str]) -> tuple[list[dict], list[dict]]:
    """(train lines, eval lines), one per step (the last), sorted by step."""
    rows = R.read_metrics(path.parent, notes)
    counts: dict[tuple[str, int], int] = {}
    for row in rows:
        if row.get(R.KIND) not in (R.TRAIN, R.EVAL):
            continue
        step = row.get(R.STEP)
        if not isinstance(step, int) or isinstance(step, bool):
            raise RunDirError(f"{path}: a line with kind={row[R.KIND]} has step={step!r}, not an integer")
        counts[row[R.KIND], step] = counts.get((row[R.KIND], step), 0) + 1
    for (kind, step), n in sorted(counts.items()):
        if n > 1:
            notes.append(f"{path.name}: step {step} ({kind}) logged {n} times, kept the last")
    return R.last_per_step(rows, R.TRAIN), R.last_per_step(rows, R.EVAL)


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Parse a run directory; raise :class:`RunDirError` naming the missing or broken file."""
    run_dir = Path(path)
    if not run_dir.exists():
        raise RunDirError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise RunDirError(f"not a directory: {run_dir}")
    if not (run_dir / RUN_CONFIG).is_file():
        raise RunDirError(
            f"{run_dir}: missing {RUN_CONFIG} (is this a run directory written by openrlhf-dppo train?)"
        )
    notes: list[str] = []
    config = upgrade_config(_read_json(run_dir / RUN_CONFIG))
    status = _read_json(run_dir / STATUS) if (run_dir / STATUS).is_file() else None
    if (run_dir / METRICS).is_file():
        train, evals = _read_metrics(run_dir / METRICS, notes)
    elif status is not None and status.get("state", "running") in R.IN_PROGRESS:
        train, evals = [], []  # started, first step not logged yet
        notes.append(f"no {METRICS} yet")
    else:
        state = "no status.json" if status is None else f"status '{status.get('state')}'"
        raise RunDirError(
            f"{run_dir}: missing {METRICS} ({state}; a run that has just started writes it after its first step)"
        )
    if status is None:
        notes.append(f"no {STATUS}: taken as in progress")
    eval_results = None
    if (run_dir / EVAL_RESULTS).is_file():
        eval_results = _read_json(run_dir / EVAL_RESULTS)
    return Run(
        name=name or run_dir.resolve().name,
        path=run_dir,
        config=config,
        train=train,
        evals=evals,
        status=status,
        eval_results=eval_results,
        notes=notes,
    )


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """run_config.json with ``dppo.enable`` (true/false) replaced by ``dppo.method`` dppo/grpo, in its
    ``dppo`` config and its args (and ``algo`` set where missing); ``argv`` as it was run."""
    config = dict(config)
    if isinstance(config.get("dppo"), dict):
        config["dppo"] = _enable_to_method(config["dppo"], "enable", "method")
        if not config.get("algo") and config["dppo"].get("method"):
            config["algo"] = config["dppo"]["method"]
    args = config.get("args")
    if isinstance(args, dict):
        args = _enable_to_method(args, "dppo.enable", "dppo.method")  # a flat namespace
        if isinstance(args.get("dppo"), dict):
            args = {**args, "dppo": _enable_to_method(args["dppo"], "enable", "method")}
        config["args"] = args
    return config


def _enable_to_method(values: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """``values`` with a boolean ``old`` replaced, in place, by ``new`` = dppo/grpo (unless ``new`` is there)."""
    if new in values or not isinstance(values.get(old), bool):
        return values
    method = "dppo" if values[old] else "grpo"
    return {(new if k == old else k): (method if k == old else v) for k, v in values.items()}


def run_names(paths: list[str | Path]) -> list[str]:
    """Directory names, lengthened with parent directories where two runs would share one."""
    parts = [Path(p).resolve().parts for p in paths]
    depth = 1
    while True:
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names) or depth >= max(len(p) for p in parts):
            return names
        depth += 1


def stopped_early(run: Run) -> str | None:
    """Why a finished run made fewer steps than set: status.json's ``reason``, or its step below
    ``max_steps``; None otherwise."""
    status = run.status or {}
    if run.state != "finished":
        return None
    reason = status.get(R.STATUS_REASON)
    if reason:
        return str(reason)
    step = number(status.get(R.STATUS_STEP))
    if step is None and run.train:
        step = float(run.train[-1][R.STEP])
    max_steps = number(status.get(R.STATUS_MAX_STEPS))
    if step is not None and max_steps is not None and step < max_steps:
        return f"it finished at step {step:.0f} of max_steps {max_steps:.0f}"
    return None
