"""The speedup arithmetic of the compare report, plain floats in and out (docs/METHOD.md, "What a step
can save"; docs/REPORT.md):

1. step-time speedup = median T_step(baseline) / median T_step(run), after the first ``warmup`` steps;
2. the ideal ratio T_run / T_baseline >= g (f + (1 - f)(1 - r_o)): f the baseline's generation share,
   r_o the run's completion prune rate, g its rollout per step relative to the baseline's;
3. the lossless ratio sum_i T_i (1 - u_i) / sum_i T_i, u_i = ``rollout/equal_reward_frac_ht``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def after_warmup(items: Sequence[T], warmup: int) -> list[T]:
    """The items (steps) without the first ``warmup`` ones; all of them when that would leave none."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    return list(items[warmup:]) if len(items) > warmup else list(items)


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def mean_or_none(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def moving_average(values: Sequence[float], k: int) -> list[float]:
    """Trailing mean over the last min(k, i + 1) values at each index i."""
    if k < 1:
        raise ValueError(f"smoothing window must be >= 1, got {k}")
    # summed afresh at each index (not a running total) so equal windows give bit-equal means
    return [sum(values[max(0, i - k + 1) : i + 1]) / min(k, i + 1) for i in range(len(values))]


def ideal_step_ratio(f: float, prompt_prune_rate: float, completion_prune_rate: float) -> float:
    """Lower bound of T_dppo / T_grpo: (1 - r_q) * (f + (1 - f) * (1 - r_o))."""
    for label, value in (("f", f), ("r_q", prompt_prune_rate), ("r_o", completion_prune_rate)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{label} must be in [0, 1], got {value}")
    return (1.0 - prompt_prune_rate) * (f + (1.0 - f) * (1.0 - completion_prune_rate))


def rollout_step_ratio(f: float, rollout: float, completion_prune_rate: float) -> float:
    """Item 2 with a measured rollout g >= 0 (may exceed 1): g * (f + (1 - f) * (1 - r_o))."""
    if not rollout >= 0.0:
        raise ValueError(f"g (samples generated per step / the baseline's) must be >= 0, got {rollout}")
    return ideal_step_ratio(f, 0.0, completion_prune_rate) * rollout


def lossless_time_ratio(shares: Sequence[float], step_times: Sequence[float]) -> float:
    """Item 3 over a run: sum_i T_i (1 - u_i) / sum_i T_i, T_i the step times.

    u_i >= 0 is not clipped at 1: in a pruning run it is a Horvitz-Thompson estimate, unbiased only
    unclipped. Raises ValueError on mismatched lengths, a negative share or no positive time."""
    if len(shares) != len(step_times) or not shares:
        raise ValueError(f"need one share per step time, got {len(shares)} and {len(step_times)}")
    if not all(u >= 0.0 for u in shares):
        raise ValueError(f"equal-reward shares must be >= 0, got {min(shares)}")
    if not all(t >= 0.0 for t in step_times) or sum(step_times) <= 0.0:
        raise ValueError("step times must be >= 0 with a positive sum")
    return sum(t * (1.0 - u) for u, t in zip(shares, step_times)) / sum(step_times)


def ratio_or_none(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den
