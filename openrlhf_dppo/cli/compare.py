"""`openrlhf-dppo compare`: does DPPO reach GRPO's held-out accuracy in less training time?

    openrlhf-dppo compare RUN_GRPO RUN_DPPO                      # one run per arm, the first the baseline
    openrlhf-dppo compare --baseline 'runs/grpo_s*' 'runs/dppo_s*' [--out DIR]
    openrlhf-dppo compare --arm grpo='runs/grpo_s*' --arm shrink='runs/shrink_s*' \
        --arm refill='runs/refill_s*' --arm grpo+df='runs/df_s*' --baseline grpo --out DIR

Reads each run directory (``openrlhf_dppo.run_dir``), groups the runs into arms (``--arm NAME=GLOB``,
or by config: runs that differ only in their seeds are one arm), prints a summary table of about 100
columns (``--tables``: every table of report.md), the warnings of
``report.checks`` (runs that stopped early or are partial, too few eval points for the smoothing
window, eval datasets not all runs share, configs or precisions that make arms not comparable, other
machines, curves at the target from their first point, speedups above the ideal) and the summary,
and, with ``--out DIR``, writes DIR/report.md and PNG plots. Globs are expanded here too, so they may be quoted. Needs
only the standard library, rich (tables) and matplotlib (plots): no torch, no OpenRLHF. Exit status: 0
on success, 2 when a run directory cannot be read or the arguments are inconsistent (the message says why).
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

from openrlhf_dppo.report import Report, RunDirError, Settings, build_report, load_run
from openrlhf_dppo.report.run import run_names

GLOB_CHARS = set("*?[")


def build_parser(prog: str = "openrlhf-dppo compare") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Does DPPO reach the baseline's held-out accuracy in less training time? Reads run "
        "directories, groups them into arms (seeds of one configuration), and prints per arm the final "
        "held-out accuracy, the training time to the target, the matched-accuracy ratio and the step-time "
        "speedup with their spread over seeds; --out also writes report.md with PNG plots.",
    )
    parser.add_argument(
        "runs",
        nargs="*",
        metavar="RUN_DIR",
        help="run directories or globs; without --baseline the first arm is the baseline",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="ARM|RUN|GLOB",
        help="the baseline arm: an arm name, one of its runs, or a path / glob of its runs (added to the runs)",
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=GLOB",
        help="put the runs matching GLOB in the arm NAME (repeatable; runs not named are grouped by config)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="ACC",
        help="held-out accuracy for the time to target (default: the baseline arm's final held-out accuracy)",
    )
    parser.add_argument(
        "--heldout",
        default=None,
        metavar="DATASET",
        help="eval dataset of the held-out curves (default: the shared one)",
    )
    parser.add_argument(
        "--eval-window",
        type=int,
        default=3,
        metavar="M",
        help="running-median window over eval points, odd (default 3: one noisy eval cannot move the result)",
    )
    parser.add_argument(
        "--target-reward",
        type=float,
        default=None,
        metavar="R",
        help="training reward for the reward time to target (default: the baseline's final smoothed reward)",
    )
    parser.add_argument(
        "--warmup", type=int, default=1, metavar="N", help="leading steps left out of the medians (default 1)"
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=5,
        metavar="K",
        help="training-reward moving-average window in steps (default 5)",
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write report.md and PNG plots into this directory"
    )
    parser.add_argument(
        "--tables",
        action="store_true",
        help="print report.md's full tables in the console too (about 200 columns wide); without it the "
        "console shows a summary table of about 100 columns",
    )
    return parser


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
    """Read the run directories (paths or globs, and ``--arm NAME=GLOB`` specs) and build the report:
    the one path from the command line to the numbers and their checks (``report.checks``), shared
    with ``benchmarks/heldout_at_time.py``. Raises RunDirError or ValueError with the reason."""
    paths, arm_of, baseline = collect(runs, arm_specs, baseline)
    loaded = [load_run(path, name) for path, name in zip(paths, run_names(paths))]
    arms = {
        run.name: arm_of[str(Path(run.path).resolve())]
        for run in loaded
        if str(Path(run.path).resolve()) in arm_of
    }
    if baseline is not None and baseline in paths:
        baseline = loaded[paths.index(baseline)].name
    return build_report(loaded, settings, baseline=baseline, arms=arms)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # runs may come after the options
    try:
        settings = Settings(
            warmup=args.warmup,
            smooth=args.smooth,
            target_reward=args.target_reward,
            target=args.target,
            eval_window=args.eval_window,
            heldout=args.heldout,
        )
        report = load_report(args.runs, args.arm, args.baseline, settings)
    except (RunDirError, ValueError) as err:
        print(f"openrlhf-dppo compare: error: {err}", file=sys.stderr)
        return 2
    from openrlhf_dppo.report.render import render_terminal, write_report

    render_terminal(report, tables=args.tables)
    if args.out:
        path = write_report(report, args.out)
        print(f"report written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
