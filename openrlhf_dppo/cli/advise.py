"""`openrlhf-dppo advise`: what a run's metrics.jsonl says about pruning on its task, and the flags to run.

    openrlhf-dppo advise RUN_DIR [RUN_DIR ...] [--gen-share 0.7] [--completion-rate 0.5] [--out DIR]

Prints, in at most 100 columns, what ``report.advise`` reads from each run (docs/ADVISE.md); ``--out DIR``
writes the same as advise.md. Exit status 0, or 2 when a run directory cannot be read or an argument is
wrong.
"""

from __future__ import annotations

import argparse
import sys

from openrlhf_dppo.report.load import expand


def _fraction(what: str):
    """A parser of a number strictly inside (0, 1); argparse names the flag in its error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
        if not 0.0 < value < 1.0:
            raise argparse.ArgumentTypeError(f"{what} lies in (0, 1), got {text}")
        return value

    return parse


def build_parser(prog: str = "openrlhf-dppo advise") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="What one or more runs' metrics say about pruning on their task (best: a GRPO run of 50+ "
        "steps), the projected step-time speedup of each method, and the flags to run it.",
    )
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or globs")
    ap.add_argument(
        "--gen-share",
        type=_fraction("a generation share of the step (0 or 1 would leave a phase free)"),
        default=None,
        metavar="F",
        help="a generation share of the step, in (0, 1), to project the speedups at too (e.g. 0.7 for a GPU run)",
    )
    ap.add_argument(
        "--completion-rate",
        type=_fraction("a completion prune rate"),
        default=0.5,
        metavar="R_O",
        help="the completion prune rate to project (--dppo.completion_prune_rate; default 0.5)",
    )
    ap.add_argument("--warmup", type=int, default=1, help="leading steps left out of the medians (default 1)")
    ap.add_argument("--out", default=None, metavar="DIR", help="write advise.md here")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from openrlhf_dppo.report import advise_render
    from openrlhf_dppo.report.advise import analyse
    from openrlhf_dppo.report.run import RunDirError
    from openrlhf_dppo.report.summary import Settings

    try:
        settings = Settings(warmup=args.warmup)
        advice = [analyse(p, settings) for pattern in args.runs for p in expand(pattern, "run")]
    except (RunDirError, ValueError) as err:
        print(f"openrlhf-dppo advise: error: {err}", file=sys.stderr)
        return 2
    print(advise_render.console_text(advice, args.gen_share, args.completion_rate))
    if args.out:
        print(
            f"advice written to {advise_render.write(advice, args.gen_share, args.completion_rate, args.out)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
