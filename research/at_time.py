"""Held-out accuracy at equal training time, per arm, mean and spread over seeds.

    python -m research.at_time --arm grpo='runs/tta/grpo_s*' --arm dppo='runs/tta/dppo_s*' \
        [--baseline grpo] [--fractions 0.25 0.5 0.75 1.0] [--heldout DATASET] [--eval-window 3]

Per arm: its final accuracy at its own mean training time beside the baseline's at that same time, then
its accuracy at fractions of the baseline arm's mean training time. Runs are read through compare's path
(``report.load.load_report``): the same arms, the same held-out curves (the mean over the eval datasets
all runs share, a running median of ``--eval-window`` points against ``time/train_s``) and the same
comparability warnings, printed under the table. A curve is read by linear interpolation between its
smoothed points; a run has no value after its last eval ("ended") or before its first smoothed point
("not yet"), and the count of seeds with a value is printed beside the mean.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

from openrlhf_dppo.report.curves import Curve
from openrlhf_dppo.report.load import load_report
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.summary import Settings
from research.common import print_analysis

ENDED, NOT_YET, NO_EVAL = "ended", "not yet", "no eval"


def value_at(times: list[float], values: list[float], t: float) -> float | None:
    """The piecewise-linear curve through (times, values) at ``t``; None outside [times[0], times[-1]]."""
    if not times or t < times[0] or t > times[-1]:
        return None
    for i in range(1, len(times)):
        if t <= times[i]:
            t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
            return v1 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return values[-1]


def reading_at(curve: Curve | None, t: float) -> float | str | None:
    """The run's smoothed held-out accuracy at training time ``t``, or why it has none: ENDED after
    its last eval, NOT_YET before its first smoothed point, NO_EVAL without a held-out curve."""
    if curve is None:
        return NO_EVAL
    if t > curve.times[-1]:
        return ENDED
    points = [(ti, v) for ti, v in zip(curve.times, curve.smoothed) if v is not None]
    if not points or t < points[0][0]:
        return NOT_YET
    return value_at([p[0] for p in points], [p[1] for p in points], t)


def fmt(values: Sequence[float | str | None]) -> str:
    """Mean ± sd over the seeds with a value, "[k of n]" when some have none; else why none has one."""
    known = [v for v in values if isinstance(v, float)]
    if not known:
        return " / ".join(sorted({str(v) if v is not None else "no value" for v in values}))
    text = f"{statistics.fmean(known):.3f}"
    if len(known) >= 2:
        text += f" ± {statistics.stdev(known):.3f}"
    if len(known) < len(values):
        text += f" [{len(known)} of {len(values)}]"
    return text


def at_time_table(report: Report, fractions: list[float], eval_window: int) -> tuple[list[dict], list[str]]:
    """Every arm's readings at the fractions of the baseline's mean training time, and the table's lines."""
    base = report.baseline
    base_time = statistics.fmean(s.train_time or 0.0 for s in base.members)
    times = [f * base_time for f in fractions]
    header = ["arm", "seeds", "training time (s)", "final acc", f"{base.name} at that time"] + [
        f"acc at {f:g} x ({t:.0f} s)" for f, t in zip(fractions, times)
    ]
    lines = [
        f"held-out accuracy ({report.heldout}, running median of {eval_window}) at fractions of "
        f"{base.name}'s mean training time {base_time:.1f} s; mean ± sd over seeds, [k of n] = seeds with "
        f"a value then ('{ENDED}': after the run's last eval, '{NOT_YET}': before its first smoothed point)",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    rows = []
    for arm in report.arms:
        ends = [s.train_time or 0.0 for s in arm.members]
        cells = [[reading_at(s.heldout, t) for s in arm.members] for t in times]
        finals = [s.heldout.final if s.heldout else None for s in arm.members]
        # the baseline's seeds at this arm's mean training time: equal time, not equal steps
        base_then = [reading_at(s.heldout, statistics.fmean(ends)) for s in base.members]
        rows.append({"arm": arm.name, "end": ends, "final": finals, "baseline_then": base_then,
                     "at": dict(zip(fractions, cells))})  # fmt: skip
        end = f"{statistics.fmean(ends):.1f}" + (f" ± {statistics.stdev(ends):.1f}" if len(ends) > 1 else "")
        then = "(baseline)" if arm is base else fmt(base_then)
        cols = [arm.name, str(arm.n), end, fmt(finals), then] + [fmt(c) for c in cells]
        lines.append("| " + " | ".join(cols) + " |")
    return rows, lines


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(
        prog="python -m research.at_time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=GLOB", help="an arm's runs")
    ap.add_argument(
        "--baseline", help="the arm whose mean training time the fractions refer to (default: first)"
    )
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--heldout", help="eval dataset (default: the mean over those all runs share)")
    ap.add_argument("--eval-window", type=int, default=3, help="running-median window over eval points, odd")
    args = ap.parse_args(argv)
    return print_analysis(
        ap,
        lambda: load_report(
            [], args.arm, args.baseline, Settings(eval_window=args.eval_window, heldout=args.heldout)
        ),
        lambda report: at_time_table(report, args.fractions, args.eval_window),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
