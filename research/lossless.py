"""The lossless limit of pruning per arm: the share of each drawn batch's groups whose G rewards are all
equal, and the training time an oracle that skipped exactly those groups would need.

    python -m research.lossless --arm grpo='runs/x/grpo_s*' [--arm dppo='runs/x/dppo_s*'] [--warmup 1]

A group whose rewards are all equal has advantage 0 under a group estimator, so without a KL or entropy
term it adds nothing to the step's gradient: it is the only part of a batch that pruning can skip and
leave GRPO's gradient exactly as it was. An oracle that rolled out and trained only the rest would take
(1 - u_i) of step i (compare's step model with rolled-out share 1 - u_i and no completion pruning):

    lossless time ratio = sum_i T_i (1 - u_i) / sum_i T_i      (``report.speedup.lossless_time_ratio``)

u_i is ``rollout/equal_reward_frac_ht`` (the Horvitz-Thompson estimate of the drawn batch's share; for
GRPO the rolled-out share itself), T_i the run's ``timing/step_total``, over the steps after ``--warmup``.
For an arm that prunes, the share is of the batches its own policy drew; the rolled-out share
(``rollout/equal_reward_frac``) below it is what its prompt selection avoided. Per arm: mean ± sd and range
over seeds, and the share over the first and the second half of each run's steps. The runs are read
through compare's path (``report.load.load_report``), whose warnings are printed under the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report.load import load_report
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.speedup import after_warmup
from openrlhf_dppo.report.summary import Settings
from research.common import print_analysis


def run_limit(member, warmup: int) -> dict[str, Any] | None:
    """One run's equal-reward shares over the steps compare uses (``report.speedup.after_warmup``) and
    its lossless time ratio (compare's own, ``RunSummary.lossless_ratio``); None when a step lacks the
    share (a run from before the metric)."""
    rows = after_warmup(member.run.train, warmup)
    got = [R.number(r.get(R.EQUAL_REWARD_FRAC_HT)) for r in rows]
    got_rolled = [R.number(r.get(R.EQUAL_REWARD_FRAC)) for r in rows]
    if member.lossless_ratio is None or any(v is None for v in got + got_rolled):
        return None
    u = [v for v in got if v is not None]
    rolled = [v for v in got_rolled if v is not None]
    half = len(u) // 2
    ratio = member.lossless_ratio
    return {
        "steps": len(u),
        "share": statistics.fmean(u),
        "rolled_out_share": statistics.fmean(rolled),
        "share_first_half": statistics.fmean(u[:half]) if half else float("nan"),
        "share_second_half": statistics.fmean(u[half:]),
        "time_ratio": ratio,
        "speedup": 1.0 / ratio if ratio > 0 else float("inf"),
    }


def spread(values: list[float], fmt: str = ".3f") -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    return f"{mean:{fmt}} ± {sd:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def arm_table(report: Report, warmup: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Every arm's row (values per seed) and the table's lines; ValueError naming a run without the share."""
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for arm in report.arms:
        limits = []
        for member in arm.members:
            limit = run_limit(member, warmup)
            if limit is None:
                raise ValueError(
                    f"--arm {arm.name}: run {member.run.name} does not log {R.EQUAL_REWARD_FRAC_HT} and "
                    f"{R.EQUAL_REWARD_FRAC} on every step after its first {warmup} (a run from "
                    "before the metric was added)"
                )
            limits.append(limit)
        rows.append({"arm": arm.name, "seeds": len(limits), **{k: [m[k] for m in limits] for k in limits[0]}})
    lines.append(
        "share of each drawn batch's groups whose rewards are all equal (no policy gradient), and the "
        "training time an oracle skipping exactly those would need, as a fraction of the arm's own; "
        "mean ± sd (range) over seeds"
    )
    head = ["arm", "seeds", "steps", "equal-reward share", "first half", "second half", "rolled-out share",
            "lossless time ratio", "lossless speedup"]  # fmt: skip
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["arm"], str(row["seeds"]), spread(row["steps"], ".0f"), spread(row["share"]),
                 spread(row["share_first_half"]), spread(row["share_second_half"]),
                 spread(row["rolled_out_share"]),
                 spread(row["time_ratio"]), spread(row["speedup"], ".2f") + "x"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return rows, lines


def main(argv=None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(prog="python -m research.lossless", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=GLOB", help="an arm's runs")
    ap.add_argument("--warmup", type=int, default=1, help="leading steps left out (compare's --warmup)")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    return print_analysis(
        ap,
        lambda: load_report([], args.arm, None, Settings(warmup=args.warmup)),
        lambda report: arm_table(report, args.warmup),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
