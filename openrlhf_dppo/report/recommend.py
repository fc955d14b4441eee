"""From ``report.advise``'s numbers to a recommendation: the flags to run, the step-time speedup bound to
expect, and what the logs are too short to tell (``openrlhf-dppo advise``).

The rule (each step is written into the advice it prints):

1. Candidates are the rules the trainer runs: ``history, unseen keep|mean`` (``proportional``) and
   ``sqrt, unseen keep|mean`` (``--dppo.prompt_policy sqrt``) at each replayed rate
   (``--dppo.prompt_rate_control fixed``), and at zero-share's own rate ``zero-share`` (``proportional``),
   ``zero-share sqrt`` and ``zero-share uniform`` (``--dppo.prompt_policy uniform``: a smaller batch at
   random, which the advice says where it is chosen); the fixed-rate ``uniform`` is the reference the
   history must beat, compared at the chosen rule's generation cost. With
   ``min_kept`` (``--min-kept``; none by default) a candidate must keep at least that expected share of
   the gradient-carrying groups.
2. The starting point is zero-share with unseen prompts scored as the mean (``--dppo.mode
   recommended``): the one setting whose time to GRPO's final held-out accuracy is measured on both
   tasks (benchmarks/RESULTS.md, current results), and whose rate follows the all-equal share as the
   policy learns. Another candidate replaces it only where it dominates it: at least its effective
   share and at least its ideal speedup, one of the two better by more than 2% (``TIE``). A kept share
   alone cannot decide (the 1/q weights keep the gradient's expectation: what a lower share costs is
   variance, which the effective share counts, against time, which the speedup counts).
   There is no floor by default: zero-share's countdown runs in the current results pruned their whole
   first epoch blind (no prompt seen before, so a uniform draw at the all-equal share, about 0.59 on
   countdown's first 50 steps: about 0.41 of the gradient groups kept) and still reached GRPO's final
   accuracy in about half its time; how low a share stays that good is not measured, so the advice
   prints the share it keeps and what keeping more would cost.
3. Where zero-share keeps less than ``min_kept``, the fastest candidate that keeps it is chosen; where
   none does and is faster than GRPO, the run is left as GRPO (no prompt pruning).
4. Completion pruning stays off (``--dppo.completion_prune_rate 0``): a prompt log cannot value it (it
   drops completions with a non-zero advantage and saves training only); the free drop of A = 0
   completions stays on (``--dppo.drop_zero_advantage``, the default).
5. Screening is not built (no flag runs it). Each of its rules is read at the chosen candidate's speedup
   (interpolated between its replayed rates, ``effective_at_speed``): it "would pay" where its effective
   share there beats the chosen one's by more than 2%, and is "not told" where the replayed rates do not
   reach that speed and what they show does not settle it.
6. The flags are written as ``--dppo.mode recommended`` (``core.config.MODE_PRESETS``: zero-share, rate 0.5
   until a step is measured, unseen mean, no completion pruning) where the chosen rule is that preset,
   followed by the settings that differ from it (or from the config's defaults, ``--dppo.prompt_policy``
   among them).
7. The prompt policies at the recommended mode's cost (zero-share's rate, unseen mean) are set against a
   uniform draw at equal cost on seen and on unseen prompts apart (``selection``: ``over uniform``): the
   advice prints each policy's effective share over it, the oracle's as the headroom.
The rule is chosen at ``--gen-share`` when it is given (the machine the user asks about), else at the
measured f and weight sync (``advise.Machine``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

import numpy as np

from openrlhf_dppo.core.config import MODE_PRESETS, DPPOConfig
from openrlhf_dppo.report.advise import NO_GRADIENT, Machine, RunAdvice, measured_machine, pooled

TIE = 0.02  # a speedup or effective share within 2% of another is a tie
BUILT = (
    "history, unseen keep",
    "history, unseen mean",
    "sqrt, unseen keep",
    "sqrt, unseen mean",
    "zero-share",
    "zero-share sqrt",
    "zero-share uniform",
)
POLICY_OF = {"zero-share sqrt": "sqrt", "zero-share uniform": "uniform", "sqrt, unseen keep": "sqrt",
             "sqrt, unseen mean": "sqrt"}  # fmt: skip  # the others: proportional
AT_RECOMMENDED = ("zero-share", "zero-share sqrt", "zero-share uniform", "zero-share oracle")
PRESET = "--dppo.mode recommended"


@dataclass(frozen=True)
class Point:
    """One rule at one rate, means over the replayed runs."""

    rule: str
    rate: float
    kept: float
    effective: float
    gen: float
    train: float

    def speedup(self, m: Machine | None) -> float | None:
        return None if m is None else 1.0 / m.step_ratio(self.gen, self.train)


@dataclass
class Recommendation:
    flags: list[str]
    chosen: Point | None
    lines: list[str]  # the advice, sentence by sentence
    screening: str  # "would pay" / "would not pay" / "not told"
    too_short: list[str] = field(default_factory=list)


def points(advice: list[RunAdvice]) -> list[Point]:
    out = []
    for rule, by_rate in pooled(advice).items():
        for _, cell in sorted(by_rate.items()):
            mean = {k: statistics.fmean(v) for k, v in cell.items()}
            out.append(Point(rule, mean["rate"], mean["kept"], mean["effective"], mean["gen"], mean["train"]))
    return out


def _fastest(cands: list[Point], f: Machine) -> Point | None:
    return max(cands, key=lambda p: p.speedup(f) or 0.0, default=None)


def dominates(a: Point, b: Point, f: Machine) -> bool:
    """``a`` is at least as effective and as fast as ``b``, one of the two by more than ``TIE``."""
    sa, sb = a.speedup(f) or 0.0, b.speedup(f) or 0.0
    if a.effective < b.effective or sa < sb:
        return False
    return a.effective > b.effective * (1 + TIE) or sa > sb * (1 + TIE)


def choose(cands: list[Point], f: Machine, min_kept: float | None = None) -> Point | None:
    """Module docstring, 2-3: zero-share unless a candidate that keeps the gradient dominates it; the
    fastest that keeps it where zero-share does not; None where no candidate keeps it."""
    ok = [p for p in cands if p.kept >= (min_kept or 0.0)]
    zero = next((p for p in ok if p.rule == "zero-share"), None)
    if zero is None:
        return _fastest(ok, f)
    better = [p for p in ok if dominates(p, zero, f)]
    return max(better, key=lambda p: p.speedup(f) or 0.0) if better else zero


def uniform_at(pts: list[Point], gen: float) -> float | None:
    """A uniform draw's kept share at generation cost ``gen``: interpolated between the replayed uniform
    rates and GRPO (cost 1, kept 1); None without a uniform point."""
    uni = sorted((p.gen, p.kept) for p in pts if p.rule == "uniform")
    if not uni or not 0.0 <= gen <= 1.0:
        return None
    return float(np.interp(gen, [0.0, *(g for g, _ in uni), 1.0], [0.0, *(k for _, k in uni), 1.0]))


def effective_at_speed(curve: list[Point], speed: float, f: Machine) -> tuple[float | None, str]:
    """One rule's effective share at the step-time speedup ``speed``, from its replayed rates: interpolated
    linearly between the two that bracket it (``"exact"``); the lowest rate's where even it is faster
    (``"at least"``: a lower rate keeps more); the highest rate's where even it is slower (``"at most"``: a
    higher rate keeps less); (None, "") without points."""
    pts = sorted(curve, key=lambda p: p.speedup(f) or 0.0)
    if not pts:
        return None, ""
    sp = [p.speedup(f) or 0.0 for p in pts]
    if speed <= sp[0]:
        return pts[0].effective, "exact" if speed == sp[0] else "at least"
    if speed > sp[-1]:
        return pts[-1].effective, "at most"
    return float(np.interp(speed, sp, [p.effective for p in pts])), "exact"


def _screening(
    screens: list[Point], chosen: Point | None, f: Machine, min_kept: float | None
) -> tuple[str, str]:
    """Does screening pay (module docstring, 5)? Each screening rule is read at the chosen rule's speedup
    (or, with no rule chosen, at just faster than GRPO): it pays where its effective share there beats the
    chosen one's (``min_kept`` against GRPO) by more than ``TIE``. Returns the verdict and its line."""
    if not screens:
        return "not told", ""
    speed, need = (chosen.speedup(f) or 0.0, chosen.effective) if chosen else (1.0 + TIE, min_kept or 0.0)
    rows = []
    for rule in sorted({p.rule for p in screens}):
        value, how = effective_at_speed([p for p in screens if p.rule == rule], speed, f)
        if value is not None:
            rows.append((value, how, rule))
    pays = [r for r in rows if r[1] in ("exact", "at least") and r[0] > need * (1 + TIE)]
    unknown = [r for r in rows if (r[1] == "at least" and not r[0] > need * (1 + TIE))
               or (r[1] == "at most" and r[0] > need * (1 + TIE))]  # fmt: skip
    verdict = "would pay" if pays else ("not told" if unknown else "would not pay")
    best = max(pays or [r for r in rows if r[1] == "exact"] or rows)
    against = f"{chosen.rule}'s {need:.1%}" if chosen else f"the floor {need:.0%}"
    line = (
        f"screening {verdict}: at {speed:.2f}x its best rule ({best[2]}) keeps an effective "
        f"{'' if best[1] == 'exact' else best[1] + ' '}{best[0]:.1%} of the gradient groups, against {against}"
    )
    if verdict == "not told":
        line += " (the replayed rates do not reach that speed: widen --rates)"
    return verdict, line


def _against_uniform(chosen: Point, uniform: float) -> str:
    """The chosen rule against a uniform draw of its generation cost (whose kept and effective shares are
    both ``uniform``): in kept share, and in effective share, which the 1/q weights' spread lowers."""
    kept, eff = chosen.kept - uniform, chosen.effective - uniform
    head = f"against a uniform draw at the same generation cost ({chosen.gen:.2f} of GRPO's, keeps {uniform:.1%}): "
    costly = " (its 1/q weights cost more variance than its foresight saves)" if eff < -0.01 else ""
    if kept <= 0.01:
        return (
            head
            + "the history is no better than a uniform draw here"
            + (f", {eff:+.1%} in effective share{costly}" if costly else "")
        )
    return (
        head + f"the history keeps {kept:+.1%} of the gradient groups, {eff:+.1%} in effective share{costly}"
    )


def over_uniform(advice: list[RunAdvice]) -> dict[str, dict[str, float]]:
    """The prompt policies at the recommended mode's cost (``AT_RECOMMENDED``): {rule: {subset: the mean over
    the runs of its effective share - a uniform draw's at equal cost}}, subsets all, seen and unseen (nan
    where no run has such a group)."""
    out: dict[str, dict[str, float]] = {}
    for rule, by_rate in pooled(advice).items():
        cell = by_rate.get(0.0)
        if rule not in AT_RECOMMENDED or cell is None:
            continue
        out[rule] = {}
        for subset, suffix in (("all", ""), ("seen", "_seen"), ("unseen", "_unseen")):
            diffs = [
                e - u
                for e, u in zip(cell[f"effective{suffix}"], cell[f"uniform{suffix}"])
                if e == e and u == u
            ]
            out[rule][subset] = statistics.fmean(diffs) if diffs else float("nan")
    return out


def _over_uniform_line(advice: list[RunAdvice]) -> str:
    rows = over_uniform(advice)
    if not rows:
        return ""

    def cell(x: float) -> str:
        return "n/a" if x != x else f"{x:+.3f}"

    parts = [f"{rule}: {cell(v['seen'])} seen, {cell(v['unseen'])} unseen" for rule, v in rows.items()]
    return (
        "effective share over a uniform draw at equal cost, at the recommended mode's rate (zero-share, unseen "
        "mean; n/a: no such group): " + "; ".join(parts)
    )


def _keeping_more(cands: list[Point], chosen: Point, f: Machine) -> str:
    """What keeping more of the gradient-carrying groups than the chosen rule would cost: the fastest
    candidate that keeps at least 75% and 90% of them (those the chosen one does not reach)."""
    parts = []
    for floor in (0.75, 0.9):
        alt = _fastest([p for p in cands if p.kept >= floor], f) if chosen.kept < floor else None
        if alt is not None:
            parts.append(f"{floor:.0%} at {alt.speedup(f) or 0.0:.2f}x (--min-kept {floor:g}: {alt.rule}, "
                         f"r = {alt.rate:.2f})")  # fmt: skip
    return "to keep more of them: " + "; ".join(parts) if parts else ""


def _fmt_speedups(p: Point, m: Machine | None, gen_share: float | None) -> str:
    parts = [] if m is None else [f"{p.speedup(m):.2f}x at f = {m.f:.2f}"]
    if gen_share is not None:
        parts.append(f"{p.speedup(Machine(gen_share)):.2f}x at gen share {gen_share:.2f}")
    return ", ".join(parts)


def recommend(
    advice: list[RunAdvice], gen_share: float | None = None, min_kept: float | None = None
) -> Recommendation:
    """The advice of the module docstring for the runs' pooled numbers."""
    f = measured_machine(advice)
    at = (
        Machine(gen_share) if gen_share is not None else f
    )  # the machine asked about (nothing fixed), else this
    too_short = sorted({note for a in advice for note in a.notes})
    pts = points(advice)
    shares = [a.trend["mean"] for a in advice if a.trend]
    lines: list[str] = []
    if shares:
        lines.append(
            f"all-equal share {statistics.fmean(shares):.3f}: the most any pruning skips at no gradient cost"
        )
    if not pts and any(a.no_gradient for a in advice):
        lines.append(
            f"{NO_GRADIENT}: GRPO learned nothing from these steps either; check the reward function and "
            "the task's difficulty (all solved or all failed)"
        )
        return Recommendation([], None, lines, "not told", too_short)
    if not pts or at is None:
        why = "no GRPO prompt log to replay" if not pts else "neither f nor --gen-share"
        lines.append(f"no rule can be chosen ({why}); rerun GRPO with --dppo.prompt_log true for 50+ steps")
        return Recommendation([], None, lines, "not told", too_short)
    chosen = choose([p for p in pts if p.rule in BUILT], at, min_kept)
    screens = [p for p in pts if p.rule.startswith("screen")]
    flags: list[str] = []
    if chosen is None or (chosen.speedup(at) or 0.0) < 1.0 + TIE:
        keeps = f"keeps {min_kept:.0%} of the gradient-carrying groups and " if min_kept else ""
        lower = ", or lower --min-kept to trade gradient for time" if min_kept else ""
        lines.append(
            f"no buildable rule {keeps}is faster than GRPO at the tested rates: run GRPO "
            f"(--dppo.enable false){lower}"
        )
        chosen = None
    else:
        flags = _flags(chosen, advice)
        lines.append(
            f"chosen: {chosen.rule}"
            + (
                f" at r = {chosen.rate:.2f}"
                if not chosen.rule.startswith("zero-share")
                else f" (its mean rate {chosen.rate:.2f})"
            )  # fmt: skip
            + f", keeps {chosen.kept:.1%} of the gradient-carrying groups (effective {chosen.effective:.1%})"
        )
        more = _keeping_more([p for p in pts if p.rule in BUILT], chosen, at)
        if more:
            lines.append(more)
        if flags[:1] == [PRESET]:
            lines.append(
                f"{PRESET} = zero-share, rate 0.5 until a step is measured, unseen mean, no completion pruning"
            )
        if chosen.rule == "zero-share uniform":
            lines.append(
                "the uniform policy selects nothing: under Adam and the full-batch normaliser it is GRPO with a "
                "smaller batch at random (--rollout.batch_size at its mean rolled-out prompts per step)"
            )
        uniform = uniform_at(pts, chosen.gen)
        if uniform is not None:
            lines.append(_against_uniform(chosen, uniform))
        lines.append(
            f"expected step-time speedup at most {_fmt_speedups(chosen, f, gen_share)}: an ideal bound "
            "(at f the measured weight sync held fixed; other overhead and packing gains left out), replayed "
            "on GRPO's own trajectory (a DPPO run's history sees only what it rolled out), and a kept gradient "
            "share is not held-out accuracy: check with compare"
        )
    line = _over_uniform_line(advice)
    if line:
        lines.append(line)
    screening, line = _screening(screens, chosen, at, min_kept)
    if line:
        bound = (
            "" if all(a.lengths_logged for a in advice) else " (round 2 charged a whole round: no lengths)"
        )
        lines.append(f"{line}{bound}; it is not built (no flag runs it)")
    lines.append("completion pruning off: a prompt log cannot value it (it saves training only)")
    return Recommendation(flags, chosen, lines, screening, too_short)


def _settings(p: Point, advice: list[RunAdvice]) -> dict[str, object]:
    """The ``--dppo.*`` settings of the chosen rule (field name -> value)."""
    mean = {name: round(statistics.fmean(getattr(a.config, attr) for a in advice), 6)  # no float dust
            for name, attr in (("history_decay", "decay"), ("history_prior", "prior"), ("q_min", "q_min"),
                               ("prompt_prune_rate_max", "zero_share_cap"))}  # fmt: skip
    if p.rule.startswith("zero-share"):
        rate: dict[str, object] = {"prompt_rate_control": "zero-share", "prompt_prune_rate": 0.5}
    else:
        rate = {"prompt_rate_control": "fixed", "prompt_prune_rate": round(p.rate, 4)}
        del mean["prompt_prune_rate_max"]
    unseen = "keep" if p.rule.endswith("keep") else "mean"
    policy = {"prompt_policy": POLICY_OF.get(p.rule, "proportional")}
    return {**rate, "unseen_prompts": unseen, "completion_prune_rate": 0.0, **policy, **mean}


def _flags(p: Point, advice: list[RunAdvice]) -> list[str]:
    """The flags for ``_settings``: ``--dppo.mode recommended`` where the preset holds them, then every
    setting that differs from the preset's (or the config's default)."""
    want = _settings(p, advice)
    defaults = {f.name: f.default for f in dataclasses.fields(DPPOConfig)}
    preset = MODE_PRESETS["recommended"]
    use_preset = all(want.get(k) == v for k, v in preset.items())
    base = {**defaults, **preset} if use_preset else defaults
    flags = [PRESET] if use_preset else []
    for name, value in want.items():
        if name in preset and use_preset:
            continue
        if name in ("prompt_rate_control", "unseen_prompts", "completion_prune_rate") or value != base.get(
            name
        ):
            flags.append(f"--dppo.{name} {value:g}" if isinstance(value, float) else f"--dppo.{name} {value}")
    return flags
