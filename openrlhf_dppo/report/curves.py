"""Held-out accuracy curves against training time, made robust to one noisy evaluation.

The rules (METHOD.md "Measuring the promise: time to accuracy"), plain floats in and out:

1. **Smoothing.** A run's eval curve (points (t_i, p_i): training time, ``eval_<dataset>_pass1``) is
   replaced by its running median over ``window`` (odd, default 3) neighbouring points; the window is
   centred and, at the two ends, moved inwards so that it always holds ``window`` points. A smoothed
   value is never above the second largest of three neighbouring measurements, so a single outlier
   can neither put the curve over a target nor set its final value. With fewer points than the
   window there is no smoothing (the report warns).
2. **Final accuracy** of a run = its smoothed value at the last eval point (window 3: the median of
   the last three evaluations).
3. **Time to target** = the first training time at which the smoothed curve reaches the target,
   linearly interpolated between the eval point below the target and the first one at or above it
   (so that the answer does not snap to the eval schedule); None ("censored") when it never does.
4. **An arm** (several seeds of one configuration) is summarised by its mean curve: at each eval
   step that all its seeds evaluated, the mean of the seeds' smoothed values, at the mean of their
   training times. Its final accuracy is the mean curve's last value (= the mean of the seeds' final
   accuracies) and its time to target the mean curve's crossing; the seeds' own values give the spread.
5. **Noise of one eval point**: the binomial standard error sqrt(p (1 - p) / n), n = eval prompts x
   samples per prompt (samples of one prompt are taken as independent: a lower bound when they agree).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def running_median(values: Sequence[float], window: int = 3) -> list[float]:
    """Median of ``window`` neighbouring values at each index (window moved inwards at the ends);
    the values unchanged when there are fewer than ``window`` of them."""
    if window < 1 or window % 2 == 0:
        raise ValueError(f"the eval smoothing window must be an odd number >= 1, got {window}")
    n = len(values)
    if n < window:
        return [float(v) for v in values]
    half = window // 2
    out = []
    for i in range(n):
        lo = min(max(i - half, 0), n - window)
        out.append(float(statistics.median(values[lo : lo + window])))
    return out


def crossing_time(times: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """First time the piecewise-linear curve through (times, values) reaches ``target``; None if never."""
    for i, (t, v) in enumerate(zip(times, values, strict=True)):
        if v >= target:
            if i == 0:
                return float(t)
            t0, v0 = times[i - 1], values[i - 1]
            return float(t0 + (target - v0) / (v - v0) * (t - t0))  # v0 < target <= v
    return None


def standard_error(p: float, n: float | None) -> float | None:
    """Binomial standard error sqrt(p (1 - p) / n) of an accuracy p measured on n samples."""
    if n is None or n <= 0 or not 0.0 <= p <= 1.0:
        return None
    return math.sqrt(p * (1.0 - p) / n)


@dataclass(frozen=True)
class Spread:
    """Mean and spread of one number over the seeds of an arm; ``values`` holds every seed (None:
    the seed has no value, e.g. never reached the target), the statistics are over the others."""

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
    """Is the difference of the two means no larger than the larger seed standard deviation?
    None when neither has a spread (fewer than two seeds with a value in both)."""
    if a.mean is None or b.mean is None:
        return None
    spreads = [s for s in (a.std, b.std) if s is not None]
    if not spreads:
        return None
    return abs(b.mean - a.mean) <= max(spreads)


@dataclass
class Curve:
    """A held-out accuracy curve: per eval point the step, the training time and the accuracy."""

    label: str  # the dataset, or "mean of a, b" over several
    steps: list[int]
    times: list[float]
    raw: list[float]
    smoothed: list[float]
    n_samples: float | None = None  # eval prompts x samples behind one point (None: unknown)

    @property
    def final(self) -> float | None:
        return self.smoothed[-1] if self.smoothed else None

    def time_to(self, target: float) -> float | None:
        return crossing_time(self.times, self.smoothed, target)

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
        )


def mean_curve(curves: Sequence[Curve]) -> tuple[Curve | None, list[Curve]]:
    """(the mean over seeds at the eval steps every seed has, each seed cut to those steps)."""
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
        [statistics.fmean(c.smoothed[i] for c in cut) for i in range(len(common))],
        cut[0].n_samples,
    )
    return mean, cut
