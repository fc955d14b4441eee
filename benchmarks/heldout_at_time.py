"""Held-out accuracy at equal training time, per arm, mean and spread over seeds.

    python benchmarks/heldout_at_time.py --arm grpo='runs/tta/grpo_s*' --arm shrink='runs/tta/shrink_s*' \
        [--baseline grpo] [--fractions 0.25 0.5 0.75 1.0] [--heldout DATASET] [--eval-window 3]

`openrlhf-dppo compare` answers "how long until the baseline's final accuracy?" When every arm runs the
same number of steps, a faster arm stops earlier, and an arm that has not reached the target by its end
is censored. This reads the same run directories with the report's own functions and answers the other
question: at a given training time, what held-out accuracy has each arm reached? Per arm: its final
accuracy at its own mean training time beside the baseline's at that same time, then every arm at
fractions of the baseline arm's mean training time. Each run's curve is the report's (running median of
``--eval-window`` eval points, against ``time/train_s``), read by linear interpolation between eval
points; a run that stopped before a time has no value there ("ended"), and the count of seeds with a
value is printed beside the mean.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openrlhf_dppo.report.run import load_run  # noqa: E402
from openrlhf_dppo.report.summary import heldout_curve, train_clock  # noqa: E402


def value_at(times: list[float], values: list[float], t: float) -> float | None:
    """The piecewise-linear curve through (times, values) at ``t``; None outside [times[0], times[-1]]."""
    if not times or t < times[0] or t > times[-1]:
        return None
    for i in range(1, len(times)):
        if t <= times[i]:
            t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
            return v1 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return values[-1]


def run_curve(path: str, dataset: str | None, window: int):
    """(training time at the last step, (times, smoothed accuracies)) of one run directory."""
    run = load_run(path)
    datasets = [dataset] if dataset else sorted(run.eval_curves())
    clock, _ = train_clock(run)
    curve = heldout_curve(run, datasets, clock, window)
    if curve is None:
        raise SystemExit(f"{path}: no held-out eval lines for {datasets}")
    return clock[run.train[-1]["step"]], (curve.times, curve.smoothed)


def fmt(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "ended"
    text = f"{statistics.fmean(known):.3f}"
    if len(known) >= 2:
        text += f" ± {statistics.stdev(known):.3f}"
    if len(known) < len(values):
        text += f" [{len(known)} of {len(values)}]"
    return text


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=GLOB", help="an arm's runs")
    ap.add_argument(
        "--baseline", help="the arm whose mean training time the fractions refer to (default: first)"
    )
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--heldout", help="eval dataset (default: every one the runs log, averaged)")
    ap.add_argument("--eval-window", type=int, default=3)
    args = ap.parse_args(argv)

    arms: dict[str, list] = {}
    for spec in args.arm:
        name, sep, pattern = spec.partition("=")
        paths = sorted(glob.glob(pattern))
        if not sep or not name or not paths:
            ap.error(f"--arm {spec!r}: expected NAME=GLOB matching at least one run directory")
        arms[name] = [run_curve(p, args.heldout, args.eval_window) for p in paths]
    baseline = args.baseline or next(iter(arms))
    if baseline not in arms:
        ap.error(f"--baseline {baseline!r} is not one of the arms {sorted(arms)}")
    base_time = statistics.fmean(end for end, _ in arms[baseline])

    times = [f * base_time for f in args.fractions]
    header = ["arm", "seeds", "training time (s)", "final acc", f"{baseline} at that time"] + [
        f"acc at {f:g} x ({t:.0f} s)" for f, t in zip(args.fractions, times)
    ]
    print(
        f"held-out accuracy (running median of {args.eval_window}) at fractions of {baseline}'s "
        f"mean training time {base_time:.1f} s; mean ± sd over seeds, [k of n] = seeds still running then"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    rows = []
    for name, runs in arms.items():
        ends = [end for end, _ in runs]
        cells = [[value_at(c[0], c[1], t) for _, c in runs] for t in times]
        finals = [c[1][-1] for _, c in runs]
        # the baseline's seeds at this arm's mean training time: equal time, not equal steps
        base_then = [value_at(c[0], c[1], statistics.fmean(ends)) for _, c in arms[baseline]]
        rows.append({"arm": name, "end": ends, "final": finals, "baseline_then": base_then,
                     "at": dict(zip(args.fractions, cells))})  # fmt: skip
        end = f"{statistics.fmean(ends):.1f}" + (f" ± {statistics.stdev(ends):.1f}" if len(ends) > 1 else "")
        then = "(baseline)" if name == baseline else fmt(base_then)
        cols = [name, str(len(runs)), end, fmt(finals), then] + [fmt(c) for c in cells]
        print("| " + " | ".join(cols) + " |")
    return rows


if __name__ == "__main__":
    main()
