"""`openrlhf-dppo compare`: does DPPO reach GRPO's held-out accuracy in less training time?

    openrlhf-dppo compare RUN_GRPO RUN_DPPO                      # one run per arm, the first the baseline
    openrlhf-dppo compare --baseline 'runs/grpo_s*' 'runs/dppo_s*' [--out DIR]
    openrlhf-dppo compare --arm grpo='runs/grpo_s*' --arm shrink='runs/shrink_s*' \
        --arm refill='runs/refill_s*' --arm grpo+df='runs/df_s*' --baseline grpo --out DIR

Reads each run directory (``openrlhf_dppo.run_dir``), groups the runs into arms (``--arm NAME=GLOB``,
or by config: runs that differ only in their seeds are one arm), prints a summary table of about 100
columns (``--tables``: every table of report.md; ``--lossless``, ``--at-time``, ``--curve-noise``: the
analyses of ``report.lossless``, ``report.at_time`` and ``report.curve_noise`` on the same arms), the
warnings of ``report.checks`` (runs that stopped early or are partial, too few eval points for the smoothing
window, eval datasets not all runs share, configs or precisions that make arms not comparable, other
machines, curves at the target from their first point, speedups above the ideal) and the summary,
and, with ``--out DIR``, writes DIR/report.md and PNG plots. Globs are expanded here too, so they may be quoted. Needs
only the standard library, rich (tables) and matplotlib (plots): no torch, no OpenRLHF. Exit status: 0
on success, 2 when a run directory cannot be read or the arguments are inconsistent (the message says why).
"""

from __future__ import annotations

import argparse
import sys

from openrlhf_dppo.report import RunDirError, Settings
from openrlhf_dppo.report.load import GLOB_CHARS, collect, expand, load_report

__all__ = ["GLOB_CHARS", "build_parser", "collect", "expand", "load_report", "main"]


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
        "--lossless",
        action="store_true",
        help="also every arm's share of groups without gradient and its lossless limit, per seed and half "
        "(report.lossless)",
    )
    parser.add_argument(
        "--at-time",
        type=float,
        nargs="+",
        default=None,
        metavar="FRAC",
        help="also every arm's held-out accuracy at these fractions of the baseline's mean training time "
        "(report.at_time; e.g. 0.25 0.5 1.0)",
    )
    parser.add_argument(
        "--curve-noise",
        type=float,
        nargs="?",
        const=0.5,
        default=None,
        metavar="FROM_FRAC",
        help="also how much held-out accuracy moves between evals from this fraction of each run's last step "
        "on (report.curve_noise; default 0.5)",
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
    extra = more_tables(report, args)
    for lines in extra:
        print("\n" + "\n".join(lines))
    if args.out:
        path = write_report(report, args.out)
        if extra:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("\n## More analyses\n\n" + "\n\n".join("\n".join(lines) for lines in extra) + "\n")
        print(f"report written to {path}")
    return 0


def more_tables(report, args: argparse.Namespace) -> list[list[str]]:
    """The tables of --lossless, --at-time and --curve-noise (each a list of markdown lines, the same as
    ``python -m openrlhf_dppo.report.<module>`` prints); a table the runs cannot give is one line saying why."""
    from openrlhf_dppo.report import at_time, curve_noise, lossless

    out = []
    if args.lossless:
        try:
            out.append(lossless.arm_table(report, args.warmup)[1])
        except ValueError as err:
            out.append([f"lossless limit: not told ({err})"])
    if args.at_time:
        out.append(at_time.at_time_table(report, args.at_time, args.eval_window)[1])
    if args.curve_noise is not None:
        if not 0.0 <= args.curve_noise < 1.0:
            out.append([f"curve noise: --curve-noise must be in [0, 1), got {args.curve_noise}"])
        else:
            try:
                out.append(curve_noise.noise_table(report, args.curve_noise)[1])
            except ValueError as err:
                out.append([f"curve noise: not told ({err})"])
    return out


if __name__ == "__main__":
    sys.exit(main())
