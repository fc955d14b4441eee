"""The warnings of ``openrlhf-dppo compare`` (docs/REPORT.md, "Warnings"), as plain sentences: run
state, steps and eval points, the shared held-out datasets, configs and machines, the curves, speedups
above the ideal, forward batches, seeds, reward keys and eval_results.json files."""

from __future__ import annotations

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import controls
from openrlhf_dppo.report.comparability import (
    MACHINE_CATEGORY,
    SET_BY_DPPO_CATEGORY,
    arm_differences,
    machine_of,
)
from openrlhf_dppo.report.model import Arm, Comparison
from openrlhf_dppo.report.run import stopped_early
from openrlhf_dppo.report.summary import RunSummary, Settings


def choose_heldout(summaries: list[RunSummary], wanted: str | None) -> tuple[list[str], list[str]]:
    """(the held-out datasets to use, warnings): ``wanted``, or every dataset all evaluated runs share."""
    per_run = {s.run.name: set(s.run.eval_curves()) for s in summaries}
    evaluated = {n: d for n, d in per_run.items() if d}
    if not evaluated:
        if wanted is not None:
            raise ValueError(f"--heldout {wanted!r}: no run has in-training eval lines")
        return [], []
    common = sorted(set.intersection(*evaluated.values()))
    if wanted is not None:
        missing = [n for n, d in evaluated.items() if wanted not in d]
        if missing:
            found = sorted(set.union(*evaluated.values()))
            raise ValueError(
                f"--heldout {wanted!r}: not evaluated by {', '.join(missing)} (found: {', '.join(found)})"
            )
        return [wanted], []
    warnings = []
    if len(evaluated) < len(per_run):
        warnings.append("no held-out eval in " + ", ".join(n for n in per_run if n not in evaluated))
    if not common:
        warnings.append("the runs share no eval dataset: no held-out comparison (pick one with --heldout)")
    elif any(d != set(common) for d in evaluated.values()):
        extra = {n: sorted(d - set(common)) for n, d in evaluated.items() if d != set(common)}
        warnings.append(
            f"held-out accuracy is the mean over the eval datasets all runs share ({', '.join(common)}); "
            "left out: " + "; ".join(f"{n}: {', '.join(d)}" for n, d in extra.items())
        )
    return common, warnings


def baseline_warnings(base: Arm) -> list[str]:
    """The baseline's runs that stopped early (check 1): the report prints these first."""
    return [
        f"the BASELINE {s.run.name} stopped early ({stopped_early(s.run)}): its final accuracy sets the "
        "target, so a short baseline lowers the target and every arm looks faster; rerun it to its full "
        "length or give --target"
        for s in base.members
        if stopped_early(s.run)
    ]


def run_warnings(s: RunSummary, settings: Settings, baseline: bool) -> list[str]:
    """Run state, steps and eval points of one run (checks 1 and 2; a baseline run that stopped early
    is :func:`baseline_warnings`')."""
    run, out = s.run, []
    reason = (run.status or {}).get(R.STATUS_REASON)
    early = stopped_early(run)
    if run.in_progress:
        out.append(f"{run.name} is {run.describe_state()}: its numbers are partial")
    elif run.state != "finished":
        why = f" ({reason})" if reason else ""
        out.append(f"{run.name} ended with state '{run.state}'{why}: its numbers are partial")
    elif early and not baseline:  # the baseline's: baseline_warnings, first of all
        out.append(f"{run.name} stopped early ({early}): its numbers cover fewer steps than it was set to")
    if not run.train:
        out.append(f"{run.name} has no training steps in metrics.jsonl yet")
    elif s.steps <= settings.warmup:
        out.append(
            f"{run.name} has {s.steps} step(s), not more than --warmup {settings.warmup}: "
            "its medians include the warm-up steps"
        )
    if s.heldout is not None and s.heldout.final is None:
        out.append(
            f"{run.name} has {len(s.heldout.steps)} eval point(s), fewer than --eval-window "
            f"{settings.eval_window}: it has no smoothed held-out value (no final accuracy, no time to "
            "target); --eval-window 1 reads the raw points"
        )
    return out + [f"{run.name}: {note}" for note in run.notes + s.clock_notes]


def machine_warnings(summaries: list[RunSummary]) -> list[str]:
    """The runs that do not record their machine (check 4; the differences are config differences)."""
    missing = [s.run.name for s in summaries if machine_of(s.run.config) is None]
    if not missing:
        return []
    return [
        f"machine not recorded in run_config.json of {', '.join(missing)} (written before it was): "
        "a comparison across machines or precisions cannot be ruled out"
    ]


def comparison_warnings(c: Comparison) -> list[str]:
    """Configs, machines and the step-time speedup of one arm against the baseline (checks 4 and 6)."""
    out, base, other = [], c.baseline.name, c.other.name
    breaking = [d for d in c.differences if d.breaks_comparison]
    packing = [d.key for d in c.differences if d.category == SET_BY_DPPO_CATEGORY]
    machine = [d for d in c.differences if d.category == MACHINE_CATEGORY]
    if breaking:
        keys = ", ".join(f"{d.key} ({d.category})" for d in breaking)
        note = controls.design_note(c)
        designed = "" if note is None else f" (it is {note}: that alone would be comparable)"
        out.append(f"{other} is not comparable with {base}: differs in {keys}{designed}")
    if packing:
        out.append(
            f"{other} and {base} differ in the packing args DPPO turns on ({', '.join(packing)}): "
            "the speedup includes packing gains; run the GRPO baseline with --train.dynamic_batch_enable "
            "to measure pruning alone"
        )
    if machine:
        what = "; ".join(f"{d.key}: {d.baseline!r} vs {d.other!r}" for d in machine)
        out.append(
            f"{other} and {base} ran on different machines ({what}): their step times, training times "
            "and time ratios mix the machines' speed with the method's"
        )
    if c.step_efficiency is not None and c.step_efficiency > 1.0:
        out.append(
            f"{other}'s step-time speedup {c.step_speedup:.2f}x is above the ideal {c.ideal_speedup:.2f}x "
            f"that its measured rollout and pruning rates allow ({c.step_efficiency:.0%}): pruning alone "
            "does not explain it (packing, the machine or its load, or a config difference does)"
        )
    return out + forward_batch_warnings(c)


def forward_batch_warnings(c: Comparison) -> list[str]:
    """The arms' experience-side forward batches per step differ (check 6; runs that log them)."""
    arms = (c.other, c.baseline)
    batches = [arm.mean_of("forward_batches") for arm in arms]
    if None in batches or batches[0] == batches[1]:
        return []
    largest = [max((s.forward_tokens_max or 0.0 for s in arm.members), default=0.0) for arm in arms]
    (o, b), (ot, bt) = batches, largest
    return [
        f"{c.other.name} made {o:g} experience-side forward batches per step (median; the largest "
        f"{ot:,.0f} tokens), {c.baseline.name} {b:g} (the largest {bt:,.0f}): OpenRLHF (GRPO) rounds its "
        "count down to a multiple of the data-parallel size, so a batch can exceed --rollout.max_tokens_per_gpu "
        "x ring x TP, while DPPO keeps each within it where the samples allow; the step times include that difference (fewer, larger "
        "forward calls: less time, more memory)"
    ]


def curve_warnings(arm: Arm, target: float | None, baseline: bool) -> list[str]:
    """An arm or its seeds at the target from their first smoothed point; a final that trails the
    last reading by more than twice the SE of one eval point (check 5)."""
    out: list[str] = []
    if arm.curve is None or arm.curve.final is None:
        return out
    if target is not None:
        first = arm.curve.first_smoothed
        seeds = [s.run.name for s in arm.members if s.heldout and s.heldout.at_target_from_start(target)]
        if first is not None and arm.curve.at_target_from_start(target):
            who = f"the baseline {arm.name}" if baseline else arm.name
            out.append(
                f"{who} is at the held-out target {target:.4f} at its first smoothed eval point (step "
                f"{arm.curve.steps[first]}, {arm.curve.times[first]:.1f} s of training): its time to "
                "target is at most that, not a measured crossing" + (" (raise --target)" if baseline else "")
            )
        elif seeds:
            out.append(
                f"arm {arm.name}: {', '.join(seeds)} at the held-out target {target:.4f} at the first "
                "smoothed eval point: those seeds' times to target are upper bounds"
            )
    se, last, final = arm.curve.se(), arm.curve.raw[-1], arm.curve.final
    if se is not None and abs(last - final) > 2 * se:
        steps = arm.curve.final_steps
        out.append(
            f"arm {arm.name}: its last eval {last:.4f} (step {arm.curve.steps[-1]}) is "
            f"{last - final:+.4f} from its final {final:.4f} (the median of the evals at steps "
            f"{steps[0]}-{steps[-1]}), more than twice the SE of one eval point ({se:.4f}): the curve "
            "still moves at its end and the final trails it; more eval points would pin it down"
        )
    if baseline:
        out += _climbing_target(arm)
    return out


def _climbing_target(base: Arm) -> list[str]:
    """The baseline's mean curve rose over its last quarter (``Curve.end_rise``) by more than its
    final's noise: the target is the end of a climb."""
    curve, n = base.measured_curve(), max(1, len(base.seed_curves))
    rise, se = curve.end_rise(), curve.se()
    if rise is None or se is None:
        return []
    (step, up), noise = rise, se / n**0.5
    if up <= noise:
        return []
    return [
        f"the baseline {base.name}'s mean held-out curve rose {up:+.4f} over the last quarter of its steps "
        f"({step}-{curve.steps[-1]}), more than the noise of its final, the target ({noise:.4f}: the SE "
        f"of one eval point over the root of {n} seed(s)): the target is the end of a climb, which an arm "
        "that learns as the baseline does per step reaches only at about its own last step (a time to "
        "target censored about half the time); run the baseline until its curve flattens, or give --target"
    ]


def arm_warnings(arm: Arm, settings: Settings, target: float | None, baseline: bool) -> list[str]:
    """One arm: its curve, each of its runs, and whether its seeds are seeds of one configuration."""
    out = curve_warnings(arm, target, baseline)
    for s in arm.members:
        out += run_warnings(s, settings, baseline)
    if arm.curve is not None and len(arm.seed_curves) < arm.n:
        out.append(f"arm {arm.name}: {arm.n - len(arm.seed_curves)} of {arm.n} seed(s) have no held-out eval")
    if arm.curve is not None and any(
        len(c.steps) < len(s.heldout.steps) for c, s in zip(arm.seed_curves, arm.members) if s.heldout
    ):
        out.append(
            f"arm {arm.name}: its seeds evaluated at different steps; the mean curve uses the "
            f"{len(arm.curve.steps)} steps they share"
        )
    for s in arm.members[1:]:
        diffs = arm_differences(arm.members[0].run.config, s.run.config)
        if diffs:
            out.append(
                f"arm {arm.name}: {s.run.name} differs from {arm.members[0].run.name} in "
                + ", ".join(d.key for d in diffs)
            )
    return out


def report_warnings(
    arm_list: list[Arm],
    comparisons: list[Comparison],
    settings: Settings,
    target: float | None,
) -> list[str]:
    """Every check of this module over every run, arm and comparison (the baseline's stopped-early
    runs are :func:`baseline_warnings`, which the report puts before all of these)."""
    base = arm_list[0]
    warnings = [w for arm in arm_list for w in arm_warnings(arm, settings, target, arm is base)]
    summaries = [s for arm in arm_list for s in arm.members]
    if base.members[0].run.algo != "grpo":
        warnings.append(f"the baseline {base.name} is a {base.members[0].run.algo} run, not GRPO")
    if len({s.reward_key for s in summaries if s.reward_raw}) > 1:
        warnings.append(
            "training rewards: some runs log rollout/reward_ht and some only rollout/reward_mean; a pruning run's "
            "reward_mean is tilted towards the prompts it kept, so those curves are not the same quantity"
        )
    for c in comparisons:
        warnings += comparison_warnings(c)
    evaluated = {s.run.name: s.run.eval_results for s in summaries if s.run.eval_results}
    if len({(r.get("k"), tuple(sorted(r.get("benchmarks") or {}))) for r in evaluated.values()}) > 1:
        sets = "; ".join(
            f"{n}: k={r.get('k')}, {sorted(r.get('benchmarks') or {})}" for n, r in evaluated.items()
        )
        warnings.append(f"the eval_results.json files differ in k or benchmarks ({sets})")
    return warnings + machine_warnings(summaries)
