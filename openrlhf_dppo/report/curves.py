"""Held-out accuracy curves against training time: running-median smoothing, final accuracy, time to
target, the mean over seeds and the noise of one eval point (the rules: docs/REPORT.md, "How the numbers
are computed"). Plain floats in and out."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def running_median(values: Sequence[float], window: int = 3) -> list[float | None]:
    """Median of the ``window`` (odd) values centred on each index; at the end the last ``window`` values;
    None where a centred window would start before the first value, and everywhere when there are fewer
    than ``window`` values. Raises ValueError for an even or non-positive window."""
    if window < 1 or window % 2 == 0:
        raise ValueError(f"the eval smoothing window must be an odd number >= 1, got {window}")
    n, half = len(values), window // 2
    out: list[float | None] = []
    for i in range(n):
        lo = min(i - half, n - window)  # moved back at the end, never forward at the start
        out.append(None if i < half or lo < 0 else float(statistics.median(values[lo : lo + window])))
    return out


def crossing_time(times: Sequence[float], values: Sequence[float | None], target: float) -> float | None:
    """First time the piecewise-linear curve through (times, values) reaches ``target``; None if never.
    None values are skipped; a first value already at the target gives its own time."""
    points = [(t, v) for t, v in zip(times, values, strict=True) if v is not None]
    for i, (t, v) in enumerate(points):
        if v >= target:
            if i == 0:
                return float(t)
            t0, v0 = points[i - 1]
            return float(t0 + (target - v0) / (v - v0) * (t - t0))  # v0 < target <= v
    return None


def standard_error(p: float, n: float | None) -> float | None:
    """Binomial standard error sqrt(p (1 - p) / n) of an accuracy p measured on n samples."""
    if n is None or n <= 0 or not 0.0 <= p <= 1.0:
        return None
    return math.sqrt(p * (1.0 - p) / n)


@dataclass(frozen=True)
class Spread:
    """One number over the seeds of an arm: ``values`` per seed (None: no value), statistics over the rest."""

    values: tuple[float | None, ...]

    @classmethod
    def of(cls, values) -> Spread:
        return cls(tuple(values))

    @property
    def known(self) -> list[float]:
        return [v for v in self.values if v is not None]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def k(self) -> int:
        return len(self.known)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.known) if self.known else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation over the seeds with a value; None below two of them."""
        return statistics.stdev(self.known) if self.k >= 2 else None

    @property
    def lo(self) -> float | None:
        return min(self.known) if self.known else None

    @property
    def hi(self) -> float | None:
        return max(self.known) if self.known else None


def within_spread(a: Spread, b: Spread) -> bool | None:
    """|mean b - mean a| <= the larger seed standard deviation; None when neither has a spread."""
    if a.mean is None or b.mean is None:
        return None
    spreads = [s for s in (a.std, b.std) if s is not None]
    if not spreads:
        return None
    return abs(b.mean - a.mean) <= max(spreads)


@dataclass
class Curve:
    """A held-out accuracy curve: per eval point the step, the training time, the accuracy and its
    smoothed value (None where the window does not fit)."""

    label: str  # the dataset, or "mean of a, b" over several
    steps: list[int]
    times: list[float]
    raw: list[float]
    smoothed: list[float | None]
    n_samples: float | None = None  # eval prompts x samples behind one point (None: unknown)
    window: int = 1  # the running-median window behind ``smoothed``

    @property
    def final(self) -> float | None:
        """The smoothed value at the last eval point (None: fewer points than the window)."""
        return self.smoothed[-1] if self.smoothed else None

    @property
    def final_steps(self) -> list[int]:
        """The eval steps whose median is the final value (the last ``window`` ones)."""
        return self.steps[-self.window :] if self.final is not None else []

    @property
    def first_smoothed(self) -> int | None:
        """Index of the first point with a smoothed value; None when there is none."""
        return next((i for i, v in enumerate(self.smoothed) if v is not None), None)

    def end_rise(self) -> tuple[int, float] | None:
        """(step, rise): the smoothed rise from the last eval step at or before 3/4 of the last step to the
        final; None where either point has no smoothed value."""
        earlier = [i for i, s in enumerate(self.steps[:-1]) if 4 * s <= 3 * self.steps[-1]]
        start = self.smoothed[earlier[-1]] if earlier else None
        if self.final is None or start is None:
            return None
        return self.steps[earlier[-1]], self.final - start

    def time_to(self, target: float) -> float | None:
        return crossing_time(self.times, self.smoothed, target)

    def at_target_from_start(self, target: float) -> bool:
        """Is the first smoothed value already at or above ``target`` (no crossing to measure)?"""
        first = next((v for v in self.smoothed if v is not None), None)
        return first is not None and first >= target

    def se(self, p: float | None = None) -> float | None:
        """Standard error of one eval point at accuracy ``p`` (default: the final accuracy)."""
        p = self.final if p is None else p
        return None if p is None else standard_error(p, self.n_samples)

    def at_steps(self, steps: Sequence[int]) -> Curve:
        """The points at ``steps`` only (each must be one of this curve's steps)."""
        index = {s: i for i, s in enumerate(self.steps)}
        pick = [index[s] for s in steps]
        return Curve(
            self.label,
            list(steps),
            [self.times[i] for i in pick],
            [self.raw[i] for i in pick],
            [self.smoothed[i] for i in pick],
            self.n_samples,
            self.window,
        )


def mean_of_all(values: Sequence[float | None]) -> float | None:
    """The mean, or None when there is no value or any value is None."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if len(known) == len(values) and known else None


def mean_curve(curves: Sequence[Curve]) -> tuple[Curve | None, list[Curve]]:
    """(the mean over seeds at the eval steps all share, at their mean training time; each seed cut to
    those steps). A step where some seed has no smoothed value has no smoothed mean."""
    if not curves:
        return None, []
    common = sorted(set.intersection(*(set(c.steps) for c in curves)))
    if not common:
        return None, []
    cut = [c.at_steps(common) for c in curves]
    mean = Curve(
        cut[0].label,
        common,
        [statistics.fmean(c.times[i] for c in cut) for i in range(len(common))],
        [statistics.fmean(c.raw[i] for c in cut) for i in range(len(common))],
        [mean_of_all([c.smoothed[i] for c in cut]) for i in range(len(common))],
        cut[0].n_samples,
        cut[0].window,
    )
    return mean, cut
