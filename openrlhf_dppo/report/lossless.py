"""The lossless limit of pruning on a task: how much of a GRPO batch has no policy gradient at all, and
the training time an oracle that skipped exactly that part would need.

    python -m openrlhf_dppo.report.lossless --arm grpo='runs/x/grpo_s*' [--arm dppo='runs/x/dppo_s*'] \
        [--warmup 1]

A group whose G rewards are all equal has advantage 0 for every completion under a group estimator
(GRPO's), so with no KL or entropy term it adds nothing to the step's gradient. Those are the only
completions any pruning can skip and leave GRPO's gradient exactly as it was. An oracle that knew
them before rollout would roll out and train only the rest: in compare's model of a step (the ideal
ratio g (f + (1 - f)(1 - r_o)), with g its rolled-out share and r_o = 0), its step i costs
(1 - u_i) of GRPO's, u_i the step's share of all-equal groups. Over a run whose steps take T_i:

    lossless time ratio = sum_i T_i (1 - u_i) / sum_i T_i      (the oracle's time / GRPO's)

A pruner that keeps GRPO's gradient exactly needs at least this fraction of GRPO's training time. A
faster one drops groups that carry gradient; whether it then learns less per step depends on the task
(benchmarks/RESULTS.md, "The lossless limit").

u_i is ``rollout/equal_reward_frac_ht`` (the Horvitz-Thompson estimate of the DRAWN batch's share; for
GRPO exactly the rolled-out share), logged by every run since the metric was added; T_i is the run's own
``timing/step_total``. The steps after ``--warmup`` enter (compare's warm-up). For an arm other than
GRPO the share is that of the batches it drew (its own policy's), and T_i its own step times: read the
GRPO arm's row for the task's limit. The rolled-out share (``rollout/equal_reward_frac``, the groups
the arm actually rolled out) below the drawn batch's estimate is what an arm's prompt selection avoided;
for GRPO the two are the same. Per arm: mean ± sd and range over seeds; the shares of the first
and second half of each run's steps show how the share moves as the policy learns.

It reads the runs through compare's own path (``report.load.load_report``): the same arm
specs and globs, and the same comparability warnings, printed under the table. compare's step-time table
gives the baseline's limit as "lossless limit (baseline)" (the same ``lossless_time_ratio``); this
adds every arm's, each seed's spread and the two halves of each run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report.load import load_report, print_analysis
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.speedup import after_warmup
from openrlhf_dppo.report.summary import Settings


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


def main(argv=None, prog: str | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
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
