"""Runs -> arms -> the compare report (:func:`build_report`). An arm is the runs named by
``--arm NAME=GLOB``, or runs whose configs differ only in seeds and per-run paths, named after their
directories' common part (``grpo_s1``, ``grpo_s2`` -> ``grpo_s*``); a repeated seed is an arm of its own.
The baseline arm is the first unless ``baseline`` names an arm or one of its runs."""

from __future__ import annotations

import json
import statistics

from openrlhf_dppo.report import checks as C
from openrlhf_dppo.report import controls
from openrlhf_dppo.report import speedup as S
from openrlhf_dppo.report.comparability import (
    SEED_KEYS,
    arm_differences,
    arm_key,
    flatten,
)
from openrlhf_dppo.report.curves import Spread, mean_curve, within_spread
from openrlhf_dppo.report.model import Arm, Comparison, Report
from openrlhf_dppo.report.run import Run
from openrlhf_dppo.report.summary import RunSummary, Settings, heldout_curve, summarize, train_clock


def pattern_name(names: list[str]) -> str:
    """``grpo_s1``, ``grpo_s2`` -> ``grpo_s*``: the common prefix and suffix around a star."""
    if len(names) == 1:
        return names[0]
    prefix = names[0]
    for n in names[1:]:
        while not n.startswith(prefix):
            prefix = prefix[:-1]
    suffix = names[0][len(prefix) :]
    for n in names[1:]:
        while not n[len(prefix) :].endswith(suffix):
            suffix = suffix[1:]
    return f"{prefix}*{suffix}" if prefix or suffix else " + ".join(names)


def _seeds(run: Run) -> str:
    args = flatten(run.config.get("args") or {})
    return json.dumps([args.get(k) for k in SEED_KEYS], default=str)


def group_runs(runs: list[Run], explicit: dict[str, str] | None = None) -> list[tuple[str, list[Run]]]:
    """[(arm name, runs)] in the order the arms first appear; ``explicit`` maps run name -> arm name."""
    explicit = explicit or {}
    named: dict[str, list[Run]] = {}
    by_config: dict[str, list[list[Run]]] = {}  # config -> arms, each holding distinct seeds
    order: list[str | list[Run]] = []  # an explicit arm's name, or the runs of an arm by config
    for run in runs:
        if run.name in explicit:
            if explicit[run.name] not in named:
                order.append(explicit[run.name])
            named.setdefault(explicit[run.name], []).append(run)
            continue
        arms = by_config.setdefault(arm_key(run.config), [])
        arm = next((a for a in arms if _seeds(run) not in {_seeds(r) for r in a}), None)
        if arm is None:  # a repeat of a seed (or a new config): an arm of its own
            arm = []
            arms.append(arm)
            order.append(arm)
        arm.append(run)
    groups = [
        (key, named[key]) if isinstance(key, str) else (pattern_name([r.name for r in key]), key)
        for key in order
    ]
    names = [n for n, _ in groups]
    return [(n if names.count(n) == 1 else f"{n} #{i + 1}", m) for i, (n, m) in enumerate(groups)]


def _arm(name: str, members: list[RunSummary], datasets: list[str], window: int) -> Arm:
    for s in members:
        s.arm = name
        s.heldout = heldout_curve(s.run, datasets, train_clock(s.run)[0], window) if datasets else None
    curve, seed_curves = mean_curve([s.heldout for s in members if s.heldout is not None])
    return Arm(name, members, curve, seed_curves)


def compare_arms(base: Arm, other: Arm) -> Comparison:
    f = base.mean_of("generation_share")
    # the kept fractions are numbers in every run (1.0 without pruning), so their means are too
    r_q = 1.0 - statistics.fmean(s.prompt_keep for s in other.members)
    r_o = 1.0 - statistics.fmean(s.completion_keep for s in other.members)
    clamp = lambda x: min(max(x, 0.0), 1.0)  # noqa: E731 - rounding noise only; keep fractions are in [0, 1]
    base_step = base.mean_of("step_time")
    # the rollout a step does, relative to the baseline's, measured where logged (speedup.py, item 2)
    measured = S.ratio_or_none(other.mean_of("generated_per_step"), base.mean_of("generated_per_step"))
    g = 1.0 - clamp(r_q) if measured is None else measured
    base_final, other_final = base.final.mean, other.final.mean
    return Comparison(
        baseline=base,
        other=other,
        step_speedup=S.ratio_or_none(base_step, other.mean_of("step_time")),
        step_speedups=Spread.of(S.ratio_or_none(base_step, s.step_time) for s in other.members),
        ttt_ratio=S.ratio_or_none(other.ttt, base.ttt) if base.ttt else None,
        ttt_ratios=Spread.of(
            S.ratio_or_none(t, base.ttt) if base.ttt else None for t in other.ttt_seeds.values
        ),
        final_delta=(
            other_final - base_final
            if base.measured and other.measured and other_final is not None and base_final is not None
            else None
        ),
        final_within_spread=within_spread(base.final, other.final),
        ttt_within_spread=within_spread(base.ttt_seeds, other.ttt_seeds),
        f=f,
        r_q=r_q,
        r_o=r_o,
        rollout=g,
        rollout_measured=measured is not None,
        ideal_ratio=S.rollout_step_ratio(clamp(f), g, clamp(r_o)) if f is not None else None,
        lossless_ratio=base.mean_of("lossless_ratio"),
        differences=controls.designed(
            other, base, arm_differences(base.members[0].run.config, other.members[0].run.config)
        ),
        control=controls.kind(other, base),
    )


def _target(base: Arm, settings: Settings) -> tuple[float | None, str]:
    target: float | None
    if settings.target is not None:
        target, source = settings.target, "--target"
    elif base.measured:
        target, source = (
            base.measured_curve().final,
            f"final held-out accuracy of the baseline {base.name} (mean over {len(base.seed_curves)} seed(s))",
        )
    else:
        target, source = None, "none (the baseline has no smoothed held-out value)"
    return target, source


def build_report(
    runs: list[Run], settings: Settings, baseline: str | None = None, arms: dict[str, str] | None = None
) -> Report:
    """Arms (explicit ``arms``: run name -> arm name, the others grouped by config) and their
    comparison with the baseline arm (the first, or the arm named by / holding the run ``baseline``)."""
    if not runs:
        raise ValueError("no runs to compare")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must be unique, got {names} (rename a directory or pass distinct paths)")
    groups = group_runs(runs, arms)
    if baseline is not None:
        match = [
            g for g in groups if baseline == g[0] or any(baseline in (r.name, str(r.path)) for r in g[1])
        ]
        if not match:
            raise ValueError(
                f"--baseline {baseline!r} is none of the runs or arms: {', '.join(n for n, _ in groups)}"
            )
        groups = [match[0]] + [g for g in groups if g is not match[0]]
    summaries = {r.name: summarize(r, settings) for r in runs}
    datasets, warnings = C.choose_heldout(list(summaries.values()), settings.heldout)
    arm_list = [
        _arm(name, [summaries[r.name] for r in members], datasets, settings.eval_window)
        for name, members in groups
    ]
    target, source = _target(arm_list[0], settings)
    for arm in arm_list:
        if target is not None and arm.curve is not None:
            arm.ttt = arm.curve.time_to(target)
            arm.ttt_seeds = Spread.of(s.heldout.time_to(target) for s in arm.members if s.heldout is not None)
    base = arm_list[0]
    comparisons = [compare_arms(base, arm) for arm in arm_list[1:]]
    warnings += C.report_warnings(arm_list, comparisons, settings, target)
    label = (
        None if not datasets else (datasets[0] if len(datasets) == 1 else "mean of " + ", ".join(datasets))
    )
    warnings = C.baseline_warnings(base) + warnings  # first: a short baseline moves every figure
    return Report(settings, arm_list, comparisons, warnings, target, source, label)
