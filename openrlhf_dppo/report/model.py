"""The records of the compare report: an arm, an arm against the baseline, the report. Plain data with
derived properties; ``report.arms`` builds them."""

from __future__ import annotations

from dataclasses import dataclass, field

from openrlhf_dppo.report import speedup as S
from openrlhf_dppo.report.comparability import Difference
from openrlhf_dppo.report.curves import Curve, Spread
from openrlhf_dppo.report.run import stopped_early
from openrlhf_dppo.report.summary import RunSummary, Settings

__all__ = ["Arm", "Comparison", "Report"]


@dataclass
class Arm:
    name: str
    members: list[RunSummary]
    curve: Curve | None = None  # mean held-out curve over the seeds (at their common eval steps)
    seed_curves: list[Curve] = field(default_factory=list)  # the seeds' curves at those steps
    ttt: float | None = None  # training time at which the mean curve reaches the target
    ttt_seeds: Spread = Spread(())  # per seed (None: never reached)

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def measured(self) -> bool:
        """Does the arm have a smoothed held-out value (a final accuracy) to compare?"""
        return self.curve is not None and self.curve.final is not None

    def measured_curve(self) -> Curve:
        """The mean held-out curve of a measured arm (``measured``); raises for an arm without one."""
        if self.curve is None or self.curve.final is None:
            raise ValueError(f"arm {self.name} has no smoothed held-out value")
        return self.curve

    @property
    def stopped_early(self) -> list[str]:
        """Its runs that finished before the step count they were set to (``report.run.stopped_early``)."""
        return [s.run.name for s in self.members if stopped_early(s.run)]

    @property
    def seeds(self) -> list:
        return [((s.run.config.get("args") or {}).get("train") or {}).get("seed") for s in self.members]

    def spread(self, attr: str) -> Spread:
        return Spread.of(getattr(s, attr) for s in self.members)

    @property
    def final(self) -> Spread:
        """Final held-out accuracy per seed (at the arm's last common eval step)."""
        return Spread.of(c.final for c in self.seed_curves)

    def mean_of(self, attr: str) -> float | None:
        return self.spread(attr).mean


@dataclass
class Comparison:
    baseline: Arm
    other: Arm
    step_speedup: float | None  # mean median step time of the baseline / of the arm
    step_speedups: Spread  # the baseline mean / each seed's median step time
    ttt_ratio: float | None  # matched-accuracy ratio: arm time to target / the baseline's
    ttt_ratios: Spread  # each seed's time to target / the baseline arm's
    final_delta: float | None  # mean final accuracy minus the baseline's
    final_within_spread: bool | None  # None: no spread (one seed each)
    ttt_within_spread: bool | None
    f: float | None  # baseline generation share (mean over its seeds)
    r_q: float  # measured prune rates of the arm (mean over its seeds)
    r_o: float
    rollout: float  # g: samples generated per step / the baseline's (1 - r_q where not logged)
    rollout_measured: bool  # g from samples/generated (False: taken as 1 - r_q)
    ideal_ratio: float | None  # lower bound of T_other / T_baseline: g (f + (1 - f)(1 - r_o))
    lossless_ratio: float | None  # the baseline's lossless limit (speedup.py item 3), mean over its seeds
    differences: list[Difference] = field(default_factory=list)
    control: str | None = None  # the arm's kind of control (report.controls.kind), None: no control

    @property
    def comparable(self) -> bool:
        return not any(d.breaks_comparison for d in self.differences)

    @property
    def ideal_speedup(self) -> float | None:
        return S.ratio_or_none(1.0, self.ideal_ratio)

    @property
    def lossless_speedup(self) -> float | None:
        return S.ratio_or_none(1.0, self.lossless_ratio)

    @property
    def step_efficiency(self) -> float | None:
        return S.ratio_or_none(self.step_speedup, self.ideal_speedup)


@dataclass
class Report:
    settings: Settings
    arms: list[Arm]  # the baseline first
    comparisons: list[Comparison]
    warnings: list[str]
    target: float | None  # held-out accuracy target
    target_source: str
    heldout: str | None  # the held-out dataset(s) the curves show

    @property
    def baseline(self) -> Arm:
        return self.arms[0]

    @property
    def summaries(self) -> list[RunSummary]:
        return [s for arm in self.arms for s in arm.members]
