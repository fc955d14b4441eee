"""How much a run's held-out accuracy moves between evaluations late in training, against what the
evaluation's own sampling noise explains.

    python benchmarks/curve_noise.py --arm grpo='runs/tta2/grpo_s*' --arm refill='runs/tta2/refill_s*' \
        [--from-frac 0.5] [--metric eval_default_pass1]

Per run, over the evaluations at or after ``--from-frac`` of its last evaluated step: the mean accuracy
p, its standard deviation, the mean absolute change between consecutive evaluations, and the standard
error a fixed policy would show, sqrt(p (1 - p) / n) with n the evaluated prompts (``eval_num_samples``).
A greedy evaluation of a fixed set has no sampling noise at all (the same prompts, argmax decoding), so
that SE is the noise of the prompt SET, not of re-evaluating it: an sd well above it means the policy
itself moves from one evaluation to the next. Per arm: the mean and the range over seeds.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openrlhf_dppo.metric_keys import EVAL_NUM_SAMPLES, KIND, STEP  # noqa: E402
from openrlhf_dppo.run_dir import METRICS  # noqa: E402


def eval_points(run: str, metric: str) -> list[tuple[int, float, int]]:
    """(step, accuracy, prompts evaluated) of every evaluation in ``run``/metrics.jsonl, by step."""
    path = Path(run) / METRICS
    if not path.is_file():
        raise SystemExit(f"{run}: no {METRICS} (not a run directory)")
    points = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get(KIND) == "eval" and metric in row:
                points[int(row[STEP])] = (float(row[metric]), int(row.get(EVAL_NUM_SAMPLES, 0)))
    return [(s, acc, n) for s, (acc, n) in sorted(points.items())]


def run_noise(points: list[tuple[int, float, int]], from_frac: float) -> dict | None:
    """The late-training statistics of one run (None: fewer than 3 evaluations in the window)."""
    if not points:
        return None
    start = from_frac * points[-1][0]
    late = [(acc, n) for step, acc, n in points if step >= start]
    if len(late) < 3:
        return None
    accs = [a for a, _ in late]
    p = statistics.fmean(accs)
    n = min(k for _, k in late)
    return {
        "evals": len(late),
        "mean": p,
        "sd": statistics.stdev(accs),
        "step_change": statistics.fmean(abs(b - a) for a, b in zip(accs, accs[1:])),
        "set_se": math.sqrt(p * (1 - p) / n) if n > 0 else float("nan"),
    }


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arm", action="append", required=True, metavar="NAME=GLOB", help="an arm's run directories"
    )
    ap.add_argument(
        "--from-frac", type=float, default=0.5, help="the window starts at this fraction of the last step"
    )
    ap.add_argument("--metric", default="eval_default_pass1", help="the held-out metric of the eval lines")
    args = ap.parse_args(argv)
    if not 0.0 <= args.from_frac < 1.0:
        ap.error(f"--from-frac must be in [0, 1), got {args.from_frac}")
    rows = []
    for spec in args.arm:
        name, sep, pattern = spec.partition("=")
        if not sep or not name or not pattern:
            ap.error(f"--arm must be NAME=GLOB, got {spec!r}")
        runs = sorted(glob.glob(pattern))
        if not runs:
            ap.error(f"--arm {name}: no run directory matches {pattern!r}")
        stats = [s for s in (run_noise(eval_points(r, args.metric), args.from_frac) for r in runs) if s]
        if not stats:
            ap.error(f"--arm {name}: no run has 3 evaluations of {args.metric} in its window")
        rows.append({"arm": name, "seeds": len(stats), **{k: [s[k] for s in stats] for k in stats[0]}})
    print(
        f"held-out {args.metric} over each run's evaluations from {args.from_frac:g} of its last step on; "
        "mean (range) over seeds"
    )
    print(
        "| arm | seeds | evals per run | mean acc | sd between evals | mean change eval to eval | SE of the prompt set |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [spread(r[k]) for k in ("mean", "sd", "step_change", "set_se")]
        print(
            f"| {r['arm']} | {r['seeds']} | {min(r['evals'])}-{max(r['evals'])} | " + " | ".join(cells) + " |"
        )
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
