"""The report's summary sentences, one per arm against the baseline: held-out accuracy on the
training-time axis with its noise (the seed spread, else the SE of one eval point), the time to target,
the step-time speedup, and marks for what the warnings say against a figure."""

from __future__ import annotations

import math

from openrlhf_dppo.report import controls
from openrlhf_dppo.report.model import Arm, Comparison, Report


def _seeds(arm: Arm) -> str:
    return f"{arm.name} ({arm.n} seed{'s' if arm.n != 1 else ''})"


def _noise(within: bool | None, a: Arm, b: Arm, what: str) -> str:
    if within is True:
        return f"within the seed spread of the {what}"
    if within is False:
        return f"larger than the seed spread of the {what}"
    if a.n == 1 and b.n == 1:
        return "one seed per arm: no spread available"
    return "too few seeds with a value for a spread"


def _accuracy(c: Comparison) -> str:
    """The accuracy clause; only for two measured arms (``Arm.measured``), whose difference is known."""
    b, o = c.baseline, c.other
    delta = c.final_delta
    if delta is None:
        raise ValueError(f"no final accuracy difference between {o.name} and {b.name}")
    text = f"final held-out accuracy {o.final.mean:.4f} vs {b.final.mean:.4f} ({delta:+.4f}, "
    text += _noise(c.final_within_spread, b, o, "final accuracy")
    se_b, se_o = b.measured_curve().se(), o.measured_curve().se()
    if se_b is not None:
        text += f"; SE of one eval point {se_b:.4f}"
    if c.final_within_spread is None and se_b is not None and se_o is not None:
        # no seed spread: the eval noise is all we can compare the difference with
        se = math.sqrt(se_b**2 + se_o**2)
        text += f", the difference is {'within' if abs(delta) <= 2 * se else 'beyond'} twice its SE {se:.4f}"
    return text + "; " + _final_span(b, o) + ")"


def _span(arm: Arm) -> str:
    steps = arm.measured_curve().final_steps
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def _final_span(b: Arm, o: Arm) -> str:
    """Which evals the finals are the median of, and the last readings (on a rising curve the
    median of the last three evals trails the last one)."""
    steps = _span(o) if _span(o) == _span(b) else f"{_span(o)} vs {_span(b)}"
    b_curve, o_curve = b.measured_curve(), o.measured_curve()
    what = "the eval at step" if o_curve.window == 1 else "the median of the evals at steps"
    return f"each {what} {steps}, last eval {o_curve.raw[-1]:.4f} vs {b_curve.raw[-1]:.4f}"


def _time_to_target(c: Comparison, target_value: float) -> str:
    b, o = c.baseline, c.other
    target = f"{target_value:.4f}"
    if b.ttt is None:
        return f"the baseline's mean curve never reaches the target {target}"
    if b.measured_curve().at_target_from_start(target_value):
        return (
            f"the baseline is at the target {target} from its first smoothed eval point: no time to accuracy"
        )
    reached = f"{o.ttt_seeds.k} of {o.ttt_seeds.n} seed{'s' if o.ttt_seeds.n != 1 else ''} reached it"
    if o.ttt is None:
        longest = max((s.train_time or 0.0) for s in o.members)
        return f"did not reach the held-out target {target} in {longest:.1f} s of training ({reached})"
    if o.measured_curve().at_target_from_start(target_value):  # no crossing measured: bounds only
        text = f"was at the held-out target {target} from its first smoothed eval point ({o.ttt:.1f} s of training, "
        text += f"vs {b.ttt:.1f} s): matched-accuracy ratio at most {c.ttt_ratio:.2f}"
    else:
        text = f"reached the held-out target {target} in {o.ttt:.1f} s of training vs {b.ttt:.1f} s: "
        text += f"matched-accuracy ratio {c.ttt_ratio:.2f}"
    if c.ttt_ratios.k > 1:
        text += f" (seeds {c.ttt_ratios.lo:.2f}–{c.ttt_ratios.hi:.2f})"
    text += f", {reached}; " + _noise(c.ttt_within_spread, b, o, "time to target")
    return text


def headline(report: Report) -> list[str]:
    """One sentence per compared arm: as accurate as the baseline, in less training time?"""
    out = []
    for c in report.comparisons:
        parts = [f"{_seeds(c.other)} vs {_seeds(c.baseline)}:"]
        if c.baseline.measured and c.other.measured:
            parts.append(_accuracy(c) + ";")
            if report.target is not None:
                parts.append(_time_to_target(c, report.target) + ";")
                if all(s.run.algo == "dppo" for s in c.other.members):  # a control says it is one
                    parts.append(f"{controls.COLUMN}: {controls.versus_control(report, c.other)};")
        else:
            missing = " and ".join(a.name for a in (c.other, c.baseline) if not a.measured)
            parts.append(f"no smoothed held-out value in {missing}: time to accuracy not measured;")
        if c.step_speedup is not None:
            step = f"{c.step_speedup:.2f}x step-time speedup"
            if c.step_efficiency is not None:
                above = ": above it, see warnings" if c.step_efficiency > 1.0 else ""
                step += f" ({c.step_efficiency:.0%} of the ideal {c.ideal_speedup:.2f}x{above})"
            parts.append(step)
        else:
            parts.append("no step-time speedup (too few steps)")
        note = controls.design_note(c)
        if note is not None:
            parts.append(f"[{note}]")
        if not c.comparable:
            parts.append("[configs differ: see warnings]")
        if c.baseline.stopped_early:
            parts.append("[the baseline stopped early, which lowers the target: see warnings]")
        if c.other.stopped_early:
            parts.append("[stopped early: see warnings]")
        out.append(" ".join(parts).rstrip(";"))
    return out
