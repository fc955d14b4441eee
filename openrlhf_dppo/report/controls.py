"""The equal-cost control arms of compare (docs/REPORT.md): **uniform selection** (a DPPO arm with
``dppo.prompt_policy uniform``) and **GRPO at DPPO's budget** (a GRPO arm with a smaller
``rollout.batch_size``), told apart by run_config.json; ``COLUMN``: a DPPO arm's time to target over its
matched control's.

    python -m openrlhf_dppo.report.controls --budget RUN_DIR   # prints the run's budget batch size
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report.comparability import CONTROL_CATEGORY, Difference, arm_key, by_design, flatten
from openrlhf_dppo.report.curves import mean_of_all
from openrlhf_dppo.report.model import Arm, Comparison, Report
from openrlhf_dppo.report.run import Run, load_run, number

COLUMN = "vs the same budget, chosen at random"
UNIFORM, BUDGET = "uniform selection", "GRPO at DPPO's budget"
NO_CONTROL = "no control run"
SHORT = {UNIFORM: "uniform", BUDGET: "GRPO budget"}  # the console summary's narrow column
UNIFORM_POLICY = "uniform"  # the value of --dppo.prompt_policy that draws every prompt with q = 1 - r
POLICY_KEYS = ("dppo.prompt_policy", "dppo_config.prompt_policy")  # where arm_key holds the policy
BUDGET_TOLERANCE = 0.1  # relative distance of a control's batch size from the arm's rolled-out prompts


def _args(run: Run) -> dict:
    return flatten(run.config.get("args") or {})


def prompt_policy(run: Run) -> str | None:
    """The run's ``--dppo.prompt_policy``; None where its config does not record one."""
    policy = (run.config.get("dppo") or {}).get("prompt_policy")
    return None if policy is None else str(policy)


def batch_size(run: Run) -> float | None:
    return number(_args(run).get("rollout.batch_size"))


def rolled_out_per_step(run: Run) -> float | None:
    """Mean prompts rolled out per training step over all its steps (``prompts/rolled_out``): the
    budget a GRPO control spends at random; None where no step logs it."""
    _, values = run.series(R.PROMPTS_ROLLED_OUT)
    return statistics.fmean(values) if values else None


def budget_batch_size(run: Run) -> int:
    """The GRPO batch of the same cost: the round (half up) of :func:`rolled_out_per_step`, at least 1."""
    mean = rolled_out_per_step(run)
    if mean is None:
        raise ValueError(
            f"{run.path}: no training step logs {R.PROMPTS_ROLLED_OUT}, so its budget (mean rolled-out "
            "prompts per step) is unknown; is it a DPPO run that has made a step?"
        )
    return max(1, math.floor(mean + 0.5))


def kind(arm: Arm, baseline: Arm) -> str | None:
    """``UNIFORM`` or ``BUDGET`` when the arm is a control (every seed of it), else None."""
    runs = [s.run for s in arm.members]
    if all(r.algo == "dppo" and prompt_policy(r) == UNIFORM_POLICY for r in runs):
        return UNIFORM
    base = [batch_size(s.run) for s in baseline.members]
    if arm is baseline or not all(s.run.algo == "grpo" for s in baseline.members) or None in base:
        return None
    full = min(b for b in base if b is not None)
    for r in runs:
        size = batch_size(r)
        filtered = _args(r).get("algo.dynamic_filtering_enable")
        if r.algo != "grpo" or filtered or size is None or size >= full:
            return None
    return BUDGET


def _scales_with_batch(key: str, run: Run, base: Run, slack: float) -> bool:
    """Whether the run's ``key`` is the baseline's times the ratio of their batch sizes, to within
    ``slack`` (0: exactly)."""
    b, b0 = batch_size(run), batch_size(base)
    v, v0 = number(_args(run).get(key)), number(_args(base).get(key))
    if b is None or not b0 or v is None or v0 is None:
        return False
    return abs(v - v0 * b / b0) <= slack


def designed_keys(arm: Arm, baseline: Arm) -> frozenset[str]:
    """The args the budget arm differs in from the baseline by design: ``rollout.batch_size``, and
    ``train.batch_size`` / ``train.num_episodes`` / ``rollout.vllm_generate_batch_size`` where they follow
    the batch; empty for an arm that is no control, and for the uniform arm (a DPPO flag)."""
    if kind(arm, baseline) != BUDGET:
        return frozenset()
    run, base = arm.members[0].run, baseline.members[0].run  # the runs report.arms compares
    keys = {"rollout.batch_size"}
    if _scales_with_batch("train.batch_size", run, base, 0.0):
        keys.add("train.batch_size")
    if _scales_with_batch("train.num_episodes", run, base, 1.0):  # each rounded up: within one
        keys.add("train.num_episodes")
    if all(_equals_batch(GENERATE_BATCH, r) for r in (run, base)):  # OpenRLHF's default fills it in
        keys.add(GENERATE_BATCH)
    return frozenset(keys)


GENERATE_BATCH = "rollout.vllm_generate_batch_size"


def _equals_batch(key: str, run: Run) -> bool:
    """Whether the run's ``key`` is its own ``rollout.batch_size`` (as OpenRLHF sets an unset
    ``--rollout.vllm_generate_batch_size``)."""
    value, b = number(_args(run).get(key)), batch_size(run)
    return value is not None and b is not None and value == b


def designed(arm: Arm, baseline: Arm, differences: list[Difference]) -> list[Difference]:
    """The arm's ``differences`` from the baseline with those it has by design under the category
    ``CONTROL_CATEGORY``, which does not break comparability."""
    return by_design(differences, designed_keys(arm, baseline))


def design_note(c: Comparison) -> str | None:
    """What the compared arm differs in by design, if it is a control: "a control (KIND) that differs
    by design in KEYS"; None for an arm that is no control."""
    if c.control is None:
        return None
    keys = [d.key for d in c.differences if d.category == CONTROL_CATEGORY]
    if c.control == UNIFORM:
        keys = [f"dppo.prompt_policy ({UNIFORM_POLICY})"]
    return f"a control ({c.control}) that differs by design in {', '.join(keys)}"


def _selection_key(arm: Arm) -> str:
    key = json.loads(arm_key(arm.members[0].run.config))
    return json.dumps({k: v for k, v in key.items() if k not in POLICY_KEYS}, sort_keys=True, default=str)


def matches(report: Report, arm: Arm) -> list[tuple[str, Arm]]:
    """[(kind, control arm)] for a DPPO arm that is no control itself; [] else."""
    base = report.baseline
    if arm is base or kind(arm, base) is not None or not all(s.run.algo == "dppo" for s in arm.members):
        return []
    controls = [(kind(a, base), a) for a in report.arms if a is not arm]
    out: list[tuple[str, Arm]] = []
    own = _selection_key(arm)
    uniform = [a for k, a in controls if k == UNIFORM and _selection_key(a) == own]
    if uniform:
        out.append((UNIFORM, uniform[0]))
    spent = mean_of_all([rolled_out_per_step(s.run) for s in arm.members])
    budget = []
    for k, a in controls:
        size = mean_of_all([batch_size(s.run) for s in a.members])
        if k == BUDGET and spent and size is not None and abs(size - spent) <= BUDGET_TOLERANCE * spent:
            budget.append((abs(size - spent), a))
    if budget:
        out.append((BUDGET, min(budget, key=lambda d: d[0])[1]))  # min keeps the first of a tie
    return out


def _versus(arm: Arm, what: str, control: Arm) -> str:
    if control.ttt == 0.0:
        return f"{what} at the target from its first eval: no ratio"
    if arm.ttt is not None and control.ttt is not None:
        return f"{arm.ttt / control.ttt:.2f}x {what}"
    if arm.ttt is not None:
        return f"{what} did not reach the target"
    if control.ttt is not None:
        return f"not reached ({what}: {control.ttt:.1f} s)"
    return f"neither reached the target ({what})"


def versus_control(report: Report, arm: Arm, short: bool = False) -> str:
    """The column's cell: the arm's time to the target over its control's, per matched control;
    ``short``: the kinds named as in ``SHORT``, for the console's summary."""
    if arm is report.baseline:
        return "baseline"
    own = kind(arm, report.baseline)
    if own is not None:
        return f"control: {SHORT[own] if short else own}"
    if not all(s.run.algo == "dppo" for s in arm.members):
        return "not a DPPO arm"
    found = [(SHORT[what] if short else what, control) for what, control in matches(report, arm)]
    if not found:
        return NO_CONTROL
    if report.target is None or arm.curve is None:
        return "time to target not measured (" + ", ".join(what for what, _ in found) + " run)"
    return "; ".join(_versus(arm, what, control) for what, control in found)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m openrlhf_dppo.report.controls", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--budget", required=True, metavar="RUN_DIR", help="print the GRPO batch of the run's cost"
    )
    args = ap.parse_args(argv)
    try:
        print(budget_batch_size(load_run(args.budget)))
    except (R.RunDirError, ValueError) as err:
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
