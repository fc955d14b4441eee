"""`openrlhf-dppo advise`: what a run's logs say about pruning on its task, and the flags to run.

    openrlhf-dppo advise RUN_DIR [RUN_DIR ...] [--gen-share 0.7] [--rates 0.25,0.5,0.75] [--out DIR]

Reads each run's metrics.jsonl and, for a GRPO run made with ``--dppo.prompt_log true``, its prompts.jsonl
(``report.advise``); replays the selection rules on the log (``report.selection``) and prints, in at
most 100 columns, the all-equal share and its trend, f and the phase times, the lossless limit, how
often prompts recur, each rule's share of gradient-carrying groups against its cost with its ideal
step-time speedup at the measured f and at ``--gen-share``, and a recommendation (``report.recommend``).
``--out DIR`` writes advise.md and advise.png. Needs no GPU and no host (torch for the history's own
code); docs/ADVISE.md says how to read it. Exit status 0, or 2 when a run directory cannot be read or
an argument is wrong (the message says why).
"""

from __future__ import annotations

import argparse
import sys

from openrlhf_dppo.report.load import expand


def _share(text: str) -> float:
    """``--gen-share``: a share of the step strictly inside (0, 1) (0: generation free, 1: training free)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"a generation share of the step lies in (0, 1) (0 or 1 would leave a phase free), got {text}"
        )
    return value


def build_parser(prog: str = "openrlhf-dppo advise") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="What one or more runs' logs say about pruning on their task (best: a GRPO run of 50+ "
        "steps with --dppo.prompt_log true), and the flags to run.",
    )
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or globs")
    ap.add_argument(
        "--gen-share",
        type=_share,
        default=None,
        metavar="F",
        help="a generation share of the step, in (0, 1), to give the speedups at too (e.g. 0.7 for a GPU run)",
    )
    ap.add_argument(
        "--rates",
        default="0.25,0.5,0.75",
        help="prompt prune rates to replay, comma-separated, in (0, 1 - q_min]",
    )
    ap.add_argument("--screen-k", default="1,2,4", help="screening's k values, comma-separated (each < G)")
    ap.add_argument(
        "--min-kept",
        type=float,
        default=None,
        help="a share of the gradient-carrying groups the recommended rule must keep (default: none, the "
        "recommended mode unless a rule dominates it)",
    )
    ap.add_argument("--warmup", type=int, default=1, help="leading steps left out of the medians (default 1)")
    ap.add_argument("--out", default=None, metavar="DIR", help="write advise.md and advise.png here")
    return ap


def _numbers(text: str, flag: str, kind=float) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be numbers separated by commas, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from openrlhf_dppo.report import advise_render
    from openrlhf_dppo.report.advise import analyse, measured_machine
    from openrlhf_dppo.report.recommend import recommend
    from openrlhf_dppo.report.run import RunDirError
    from openrlhf_dppo.report.summary import Settings

    try:
        rates = _numbers(args.rates, "--rates")
        ks = _numbers(args.screen_k, "--screen-k", int)
        if any(not 0.0 < r < 1.0 for r in rates):
            raise ValueError(f"--rates must lie in (0, 1 - q_min], got {args.rates}")
        if args.min_kept is not None and not 0.0 < args.min_kept <= 1.0:
            raise ValueError(f"--min-kept must be in (0, 1], got {args.min_kept}")
        paths = [p for pattern in args.runs for p in expand(pattern, "run")]
        settings = Settings(warmup=args.warmup)
        advice = [analyse(p, settings, rates, ks) for p in paths]
        for a in advice:
            bad = [r for r in rates if not 0.0 < r <= 1.0 - a.config.q_min + 1e-12]
            if bad:
                raise ValueError(f"--rates must lie in (0, 1 - q_min = {1 - a.config.q_min:g}], got {bad}")
    except (RunDirError, ValueError) as err:
        print(f"openrlhf-dppo advise: error: {err}", file=sys.stderr)
        return 2
    rec = recommend(advice, args.gen_share, args.min_kept)
    f = measured_machine(advice)
    print(advise_render.console_text(advice, rec, f, args.gen_share))
    if args.out:
        print(f"advice written to {advise_render.write(advice, rec, f, args.gen_share, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
