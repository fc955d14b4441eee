"""The run directory: the names of its files, its writer and its one reader (docs/DESIGN.md, "Run directory").

A run directory (``--dppo.run_dir``, default ``--ckpt.output_dir``) holds ``run_config.json`` (the
arguments, the DPPO config, the algorithm, the hardware and ``machine`` record, the start time),
``metrics.jsonl`` (one ``{"kind": "train"|"eval", "step", "time", "wall_time", ...}`` line per step or
evaluation; the writer adds ``time/train_s`` and ``time/startup_s``), ``status.json`` (replaced atomically;
the states: ``STATES``) and, optionally, ``eval_results.json``. Standard library only: ``openrlhf-dppo
compare`` reads run directories without torch or the host. Every consumer reads ``metrics.jsonl`` through
:func:`read_metrics`. The metric keys are named in ``openrlhf_dppo.metric_keys`` and re-exported here.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from openrlhf_dppo.metric_keys import *  # noqa: F403 - re-exported: R.STEP_TOTAL, R.pass1_key, ...
from openrlhf_dppo.metric_keys import KIND, STARTUP_S, STEP, STEP_TOTAL, TIME, TRAIN, TRAIN_S, WALL_TIME

# ---- files ---------------------------------------------------------------------------------------
RUN_CONFIG = "run_config.json"
METRICS = "metrics.jsonl"
STATUS = "status.json"
EVAL_RESULTS = "eval_results.json"
REPLACED = METRICS + ".replaced-"  # + n: the lines a resume cut from metrics.jsonl

# ---- status.json ----------------------------------------------------------------------------------
# running, finished, failed: the trainer's. interrupted: stopped by a signal, not final (whoever stopped
# it records the outcome). cancelled, requeued (and failed for a silent death): the launcher's.
RUNNING, INTERRUPTED, FINISHED, FAILED = "running", "interrupted", "finished", "failed"
CANCELLED, REQUEUED = "cancelled", "requeued"
STATES = (RUNNING, INTERRUPTED, FINISHED, FAILED, CANCELLED, REQUEUED)
IN_PROGRESS = (RUNNING, INTERRUPTED, REQUEUED)  # the run is not over: a reader shows partial numbers
# "1" in everything a launcher (openrlhf_dppo.launch) starts: the launcher records how the run ended
LAUNCHED_ENV = "OPENRLHF_DPPO_LAUNCHED"
# Ray's errors for a process of the run that is gone (matched by class name: run_dir imports no Ray)
RAY_PROCESS_DEATHS = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                      "NodeDiedError", "LocalRayletDiedError")  # fmt: skip


# ---- status.json keys the readers check ----------------------------------------------------------
STATUS_STEP, STATUS_MAX_STEPS = "step", "max_steps"
STATUS_REASON = "reason"  # why a run ended as it did (e.g. the prompts ran out before --dppo.max_steps)

# ---- run_config.json: the machine a run ran on (``precision.machine``, via ``RunMeta.machine``) --------
MACHINE = "machine"  # {cpu_model, cpu_native_bf16, torch_cpu_capability, device, precision, isa_caps}
MACHINE_CPU_MODEL = "cpu_model"  # str: /proc/cpuinfo's model name
MACHINE_CPU_NATIVE_BF16 = "cpu_native_bf16"  # bool: oneDNN has bf16 kernels for this CPU (env caps count)
MACHINE_TORCH_CPU_CAPABILITY = "torch_cpu_capability"  # str: ATen's CPU kernel level ("AVX512", "AVX2")
MACHINE_DEVICE = "device"  # "cpu" | "cuda": the workers' (RunMeta.device), not the writer's torch
MACHINE_PRECISION = "precision"  # "bf16" | "fp16" | "fp32": the run's --ds.param_dtype
MACHINE_FIELDS = (
    MACHINE_CPU_MODEL,
    MACHINE_CPU_NATIVE_BF16,
    MACHINE_TORCH_CPU_CAPABILITY,
    MACHINE_DEVICE,
    MACHINE_PRECISION,
)
# {name: value} of ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA where set (an emulated CPU); not compared:
# the capped fields above already differ
MACHINE_ISA_CAPS = "isa_caps"


# ---- reading ----------------------------------------------------------------------------------------
def parse_metrics(text: str, name: str = METRICS, notes: list[str] | None = None) -> list[dict]:
    """The JSON objects of a metrics.jsonl text, in file order; blank lines ignored. Any other line is
    skipped and named in ``notes``: the last as "a partial last line", others as "not a JSON object"."""
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif notes is not None:
            what = "a partial last line" if i == last else "a line that is not a JSON object"
            notes.append(f"{name}: skipped {what} ({i + 1})")
    return rows


def read_metrics(run_dir: str | os.PathLike, notes: list[str] | None = None) -> list[dict]:
    """Every line of ``run_dir/metrics.jsonl`` as a dict, in file order; [] when there is no file yet.
    What is skipped: :func:`parse_metrics`. Repeated steps are returned as written (:func:`last_per_step`)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    return parse_metrics(path.read_text(encoding="utf-8"), METRICS, notes)


def last_per_step(rows: list[dict], kind: str) -> list[dict]:
    """The lines of ``kind`` with an integer step, the last one for each step, sorted by step."""
    table = {}
    for row in rows:
        if row.get(KIND) == kind and isinstance(row.get(STEP), int) and not isinstance(row[STEP], bool):
            table[row[STEP]] = row
    return [table[s] for s in sorted(table)]


def number(value: Any) -> float | None:
    """A finite int or float as float; None for anything else (bools, "nan" strings, lists)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class RunDirError(ValueError):
    """A run directory or one of its files cannot be read; the message names the file at fault."""


def read_json_object(path: str | os.PathLike) -> dict:
    """The JSON object in ``path`` (run_config.json, status.json, eval_results.json); anything else raises
    :class:`RunDirError` naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RunDirError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_status(run_dir: str | os.PathLike) -> dict | None:
    """status.json as a dict; None when there is none. A broken file raises RunDirError naming it."""
    path = Path(run_dir) / STATUS
    return read_json_object(path) if path.is_file() else None


# ---- writing ------------------------------------------------------------------------------------
def _write_json(path: Path, obj) -> None:
    """Write ``obj`` to ``path`` atomically (a reader sees the old or the new file, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # the trainer and the launcher both write
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


def write_status(run_dir: str | os.PathLike, state: str, step: int | None, **extra) -> dict:
    """Replace status.json: ``{"state", "step", "max_steps", "updated", **extra}`` (e.g. ``reason``).

    ``step=None`` and an absent ``max_steps`` keep the current file's (step 0 without one). "interrupted"
    never replaces failed, cancelled or requeued: the file is then left as it is and returned.
    """
    if state not in STATES:
        raise ValueError(f"status state must be one of {', '.join(STATES)}; got {state!r}")
    old = {}
    try:
        old = read_status(run_dir) or {}
    except ValueError:
        pass  # a broken status file is replaced
    if state == INTERRUPTED and old.get("state") in (FAILED, CANCELLED, REQUEUED):
        return old
    status = {
        "state": state,
        "step": int(old.get("step", 0) if step is None else step),
        "max_steps": extra.pop("max_steps", old.get("max_steps")),
        "updated": time.time(),
    }
    status.update({k: v for k, v in extra.items() if v is not None})
    _write_json(Path(run_dir) / STATUS, status)
    return status


def ended_by(err: BaseException, launched: bool = False) -> tuple[str, str]:
    """(state, reason) for status.json when training ends with ``err``: "interrupted" for ``SystemExit``
    (a signal) or ``KeyboardInterrupt``, and, when ``launched`` (``LAUNCHED_ENV``), for the death of
    another Ray process of the run (``RAY_PROCESS_DEATHS``); else "failed"."""
    text = " ".join(str(err).split())
    what = f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__
    if isinstance(err, (SystemExit, KeyboardInterrupt)):
        return INTERRUPTED, f"the trainer was stopped ({what}); the launcher, if any, records the outcome"
    if launched and any(c.__name__ in RAY_PROCESS_DEATHS for c in type(err).__mro__):
        return INTERRUPTED, f"a Ray process of the run died ({what}); the launcher records the outcome"
    return FAILED, what


def to_plain(obj):
    """Nested namespaces / dicts / sequences / tensors (by ``item``/``tolist``) -> JSON-able values; a
    non-finite float becomes its string ("nan", "inf"); anything else: its str."""
    if isinstance(obj, SimpleNamespace):
        return {k: to_plain(v) for k, v in vars(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if hasattr(obj, "tolist") and hasattr(obj, "item"):  # torch.Tensor, numpy array or scalar
        size = getattr(obj, "numel", None)
        one = (size() if callable(size) else getattr(obj, "size", 1)) == 1
        return to_plain(obj.item() if one else obj.tolist())
    return str(obj)


def hardware() -> dict:
    """Host name, CPU and the GPUs torch sees (when the process has imported torch)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    gpus = (
        [cuda.get_device_name(i) for i in range(cuda.device_count())] if cuda and cuda.is_available() else []
    )
    return {
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "num_cpus": os.cpu_count(),
        "gpus": gpus,
        "num_gpus": len(gpus),
    }


def _installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class RunMeta:
    """What the launching command knows and ``run_config.json`` records: its command line (after ``--config``
    expansion), the process's start time (None: the run directory's creation), the CLI's validated
    ``RunOptions`` (None: OpenRLHF's settings decide), ``device`` and ``machine`` (None: none written)."""

    argv: list[str] = field(default_factory=list)
    start_time: float | None = None
    run_dir: str | None = None
    max_steps: int | None = None
    schedule_steps: int | None = None
    device: str | None = None  # MACHINE_DEVICE: where the workers compute (compat.cpu.decide on the driver)
    machine: dict | None = None  # MACHINE: the driver's precision.machine(--ds.param_dtype, device)


class RunDir:
    """The trainer's writer: run_config.json, one metrics line per step and evaluation, status.json.

    ``RunDir(path, max_steps)``; ``write_config(args, dppo_config, algo, argv, start_time, machine)`` once at
    start; ``log(kind, step, values)`` per train step / evaluation; ``status(state, step)``; ``resume(step)`` when a
    checkpoint at ``step`` has been restored (or none: step 0).
    """

    def __init__(self, path: str | os.PathLike, max_steps: int | None = None) -> None:
        self.path = Path(path)
        self.max_steps = max_steps
        self.start = time.time()  # origin of wall_time
        self.start_time = self.start  # process start (run_config.json), origin of time/startup_s
        self.train_s = 0.0
        self._own_lines = 0  # lines this process appended: a resume never cuts them
        self._first_train = True
        self.path.mkdir(parents=True, exist_ok=True)
        metrics = self.path / METRICS
        if metrics.is_file() and metrics.stat().st_size:
            with open(metrics, "rb+") as fh:  # end a line cut short by a kill: ours start on a new line
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")

    def write_config(
        self,
        args,
        dppo_config,
        algo: str,
        argv: list[str],
        start_time: float | None,
        machine: dict | None = None,
    ) -> None:
        """argv, start_time: the launching command's (``RunMeta``); start_time None: this directory's.
        ``machine``: the record under ``MACHINE`` (``MACHINE_FIELDS`` and ``MACHINE_ISA_CAPS``)."""
        from openrlhf_dppo import __version__

        self.start_time = float(start_time or self.start)
        config = {
            "openrlhf_dppo_version": __version__,
            "openrlhf_version": _installed_version("openrlhf"),
            "argv": list(argv),
            "args": to_plain(vars(args)),
            "dppo": dppo_config.asdict(),
            "algo": algo,
            "hardware": hardware(),
            "start_time": self.start_time,
        }
        if machine is not None:
            config[MACHINE] = to_plain(machine)
        _write_json(self.path / RUN_CONFIG, config)

    def log(self, kind: str, step: int, values: dict) -> dict:
        """Append one line; adds ``time``, ``wall_time`` and the time/* keys (they win over ``values``)."""
        now = time.time()
        line = {KIND: kind, STEP: int(step), TIME: now, WALL_TIME: now - self.start}
        line.update({k: to_plain(v) for k, v in values.items() if k != "generated_samples"})
        if kind == TRAIN:
            total = number(line.get(STEP_TOTAL))
            self.train_s += total or 0.0
            if self._first_train:
                line[STARTUP_S] = max(now - (total or 0.0) - self.start_time, 0.0)
                self._first_train = False
        line[TRAIN_S] = self.train_s
        with open(self.path / METRICS, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        self._own_lines += 1
        return line

    def status(self, state: str, step: int | None, reason: str | None = None) -> dict:
        return write_status(self.path, state, step, max_steps=self.max_steps, reason=reason)

    def resume(self, step: int) -> int:
        """Cut metrics.jsonl back to a restored checkpoint at ``step``; returns the number of lines cut.

        Lines of earlier processes with a step <= ``step`` stay (none at step 0); the rest go to
        ``metrics.jsonl.replaced-<n>``. This process's own lines are never cut. ``time/train_s``
        continues from the kept lines.
        """
        path = self.path / METRICS
        if not path.is_file():
            return 0
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        inherited, own = lines[: len(lines) - self._own_lines], lines[len(lines) - self._own_lines :]
        keep: list[str] = []
        cut: list[str] = []
        for line in inherited:
            row = parse_metrics(line)
            s = row[0].get(STEP) if row else None
            kept = step > 0 and isinstance(s, int) and not isinstance(s, bool) and s <= step
            (keep if kept else cut).append(line)
        self.train_s = _train_time_after(parse_metrics("\n".join(keep + own)))
        if not cut:
            return 0
        n = 1 + sum(1 for p in self.path.iterdir() if p.name.startswith(REPLACED))
        (self.path / f"{REPLACED}{n}").write_text("".join(x + "\n" for x in cut), encoding="utf-8")
        tmp = self.path / f".{METRICS}.tmp"
        tmp.write_text("".join(x + "\n" for x in keep + own), encoding="utf-8")
        os.replace(tmp, path)
        return len(cut)


def _train_time_after(rows: list[dict]) -> float:
    """Training time at the end of ``rows``: the last train line's time/train_s, or (older files
    without it) the sum of timing/step_total over one line per step."""
    train = last_per_step(rows, TRAIN)
    if not train:
        return 0.0
    last = number(train[-1].get(TRAIN_S))
    return last if last is not None else sum(number(r.get(STEP_TOTAL)) or 0.0 for r in train)
