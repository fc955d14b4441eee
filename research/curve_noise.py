"""How much a run's held-out accuracy moves between evaluations late in training, against the standard
error of the evaluated prompt set.

    python -m research.curve_noise --arm grpo='runs/tta/grpo_s*' [--from-frac 0.5] [--heldout DATASET]

Per run, over the evaluations at or after ``--from-frac`` of its last evaluated step: the mean accuracy
p, its standard deviation, the mean absolute change between consecutive evaluations, and
sqrt(p (1 - p) / n), n the evaluated samples. A greedy evaluation of a fixed set has no sampling noise,
so that SE is the noise of the prompt set: an sd well above it means the policy itself moves from one
evaluation to the next. Per arm: the mean and the range over seeds. Runs are read through compare's
path (``report.load.load_report``), whose warnings are printed under the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from openrlhf_dppo.report.curves import Curve, standard_error
from openrlhf_dppo.report.load import load_report
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.summary import Settings
from research.common import print_analysis


def run_noise(curve: Curve | None, from_frac: float) -> dict | None:
    """The late-training statistics of one run's raw held-out points (None: fewer than 3 in the window)."""
    if curve is None or not curve.steps:
        return None
    start = from_frac * curve.steps[-1]
    accs = [a for step, a in zip(curve.steps, curve.raw) if step >= start]
    if len(accs) < 3:
        return None
    p = statistics.fmean(accs)
    se = standard_error(p, curve.n_samples)
    return {
        "evals": len(accs),
        "mean": p,
        "sd": statistics.stdev(accs),
        "step_change": statistics.fmean(abs(b - a) for a, b in zip(accs, accs[1:])),
        "set_se": float("nan") if se is None else se,
    }


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def noise_table(report: Report, from_frac: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Every arm's late-training statistics (values per seed) and the table's lines; ValueError when an arm
    has no run with 3 evaluations in its window."""
    rows: list[dict[str, Any]] = []
    for arm in report.arms:
        stats = [s for s in (run_noise(m.heldout, from_frac) for m in arm.members) if s]
        if not stats:
            raise ValueError(f"--arm {arm.name}: no run has 3 held-out evaluations in its window")
        rows.append({"arm": arm.name, "seeds": len(stats), **{k: [s[k] for s in stats] for k in stats[0]}})
    lines = [
        f"held-out accuracy ({report.heldout}) over each run's evaluations from {from_frac:g} of its last "
        "step on; mean (range) over seeds",
        "| arm | seeds | evals per run | mean acc | sd between evals | mean change eval to eval | SE of the "
        "prompt set |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [spread(r[k]) for k in ("mean", "sd", "step_change", "set_se")]
        lines.append(
            f"| {r['arm']} | {r['seeds']} | {min(r['evals'])}-{max(r['evals'])} | " + " | ".join(cells) + " |"
        )
    return rows, lines


def main(argv=None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(prog="python -m research.curve_noise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=GLOB", help="an arm's runs")
    ap.add_argument(
        "--from-frac", type=float, default=0.5, help="the window starts at this fraction of the last step"
    )
    ap.add_argument("--heldout", help="eval dataset (default: the mean over those all runs share)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.from_frac < 1.0:
        ap.error(f"--from-frac must be in [0, 1), got {args.from_frac}")
    return print_analysis(
        ap,
        lambda: load_report([], args.arm, None, Settings(eval_window=1, heldout=args.heldout)),
        lambda report: noise_table(report, args.from_frac),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
