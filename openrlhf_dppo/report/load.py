"""Command-line run specs (paths, globs, ``--arm NAME=GLOB``, the baseline) -> the built report."""

from __future__ import annotations

import glob
from pathlib import Path

from openrlhf_dppo.report.arms import build_report
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.run import load_run, run_names
from openrlhf_dppo.report.summary import Settings

GLOB_CHARS = set("*?[")


def expand(pattern: str, flag: str) -> list[str]:
    """A glob -> the directories it matches (sorted; an error when none); a plain path -> itself."""
    if not GLOB_CHARS & set(pattern):
        return [pattern]
    found = sorted(p for p in glob.glob(pattern) if Path(p).is_dir())
    if not found:
        raise ValueError(f"{flag} {pattern!r} matches no run directory")
    return found


def collect(
    runs: list[str], arm_specs: list[str], baseline: str | None
) -> tuple[list[str], dict[str, str], str | None]:
    """(run directories in order, {path: arm name} from --arm, the baseline for build_report)."""
    paths: list[str] = []
    arm_of: dict[str, str] = {}

    def add(path: str) -> None:
        if all(Path(path).resolve() != Path(p).resolve() for p in paths):
            paths.append(path)

    arm_names = []
    for spec in arm_specs:
        name, sep, pattern = spec.partition("=")
        if not sep or not name or not pattern:
            raise ValueError(f"--arm expects NAME=GLOB, got {spec!r}")
        arm_names.append(name)
        for path in expand(pattern, f"--arm {name}="):
            add(path)
            arm_of[str(Path(path).resolve())] = name
    if baseline is not None and baseline not in arm_names:
        # a path or a glob of run directories; anything else names an arm or a run (checked later)
        found = (
            [baseline]
            if Path(baseline).is_dir()
            else sorted(p for p in glob.glob(baseline) if Path(p).is_dir())
        )
        for path in found:
            add(path)
        baseline = found[0] if found else baseline
    for pattern in runs:
        for path in expand(pattern, "run"):
            add(path)
    if not paths:
        raise ValueError("no run directories given")
    return paths, arm_of, baseline


def load_report(runs: list[str], arm_specs: list[str], baseline: str | None, settings: Settings) -> Report:
    """Read the run directories (paths or globs, and ``--arm NAME=GLOB`` specs) and build the report with
    its checks (``report.checks``). Raises RunDirError or ValueError with the reason."""
    paths, arm_of, baseline = collect(runs, arm_specs, baseline)
    loaded = [load_run(path, name) for path, name in zip(paths, run_names(list(paths)))]
    arms = {
        run.name: arm_of[str(Path(run.path).resolve())]
        for run in loaded
        if str(Path(run.path).resolve()) in arm_of
    }
    if baseline is not None and baseline in paths:
        baseline = loaded[paths.index(baseline)].name
    return build_report(loaded, settings, baseline=baseline, arms=arms)
