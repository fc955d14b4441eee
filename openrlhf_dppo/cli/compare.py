"""`openrlhf-dppo compare`: does DPPO reach GRPO's held-out accuracy in less training time? (docs/REPORT.md)

    openrlhf-dppo compare RUN_GRPO RUN_DPPO                      # one run per arm, the first the baseline
    openrlhf-dppo compare --baseline 'runs/grpo_s*' 'runs/dppo_s*' [--out DIR]
    openrlhf-dppo compare --arm grpo='runs/grpo_s*' --arm dppo='runs/dppo_s*' \
        --arm uniform='runs/uniform_s*' --arm grpo+df='runs/df_s*' --baseline grpo --out DIR

Globs are expanded here too. Needs the standard library, rich and matplotlib only. Exit status 0, or 2
when a run directory cannot be read or the arguments clash.
"""

from __future__ import annotations

import argparse
import sys

from openrlhf_dppo.report import RunDirError, Settings
from openrlhf_dppo.report.load import load_report


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
        "--warmup", type=int, default=1, metavar="N", help="leading steps left out of the medians (default 1)"
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # runs may come after the options
    try:
        settings = Settings(
            warmup=args.warmup,
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
        print(f"report written to {write_report(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
