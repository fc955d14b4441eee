"""The speedup arithmetic of the compare report: plain floats in, plain floats out.

Four numbers answer "was DPPO faster?":

1. step-time speedup  = median T_step(baseline) / median T_step(run), medians over the steps after
   the first ``warmup`` ones (compilation, cache warm-up and the first weight sync inflate them);
2. time-to-target speedup = t*(baseline) / t*(run), t* the first wall time at which the smoothed
   reward reaches the target (the paper-style "training speedup"); the smoothed reward at step i is
   the mean of the rewards of the last k logged steps (fewer at the start of the run);
3. the ideal speedup, the physical limit of pruning (docs/METHOD.md, "What a step can save"):
       T_dppo / T_grpo >= (1 - r_q) * (f + (1 - f) * (1 - r_o)),
   f the generation share of a baseline step, r_q / r_o the run's measured prompt / completion
   pruning rates; the measured speedups are also given as a fraction of 1 / that bound. The factor
   (1 - r_q) stands for the rollout a step does relative to the baseline's; the report uses the
   measured rollout, g = samples generated per step / the baseline's, in its place
   (``rollout_step_ratio``), which also holds for an arm that rolls out more (dynamic filtering);
4. the lossless limit (``lossless_time_ratio``): a group whose rewards are all equal has advantage 0
   under a group estimator, and no policy gradient; only those groups can be skipped with the step's
   gradient left exactly as the baseline's. An oracle that rolled out and trained only the rest would
   take (1 - u_i) of the baseline's step i in the model of item 3 (g = 1 - u_i, r_o = 0), u_i the
   step's share of such groups (``rollout/equal_reward_frac_ht``). An arm faster than that must
   drop groups that carry gradient, and learn from a smaller batch a step.
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


def time_to_target(times: Sequence[float], smoothed: Sequence[float], target: float) -> float | None:
    """First time at which the smoothed reward is >= target; None when it never is."""
    for t, r in zip(times, smoothed, strict=True):
        if r >= target:
            return t
    return None


def ideal_step_ratio(f: float, prompt_prune_rate: float, completion_prune_rate: float) -> float:
    """Lower bound of T_dppo / T_grpo: (1 - r_q) * (f + (1 - f) * (1 - r_o))."""
    for label, value in (("f", f), ("r_q", prompt_prune_rate), ("r_o", completion_prune_rate)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{label} must be in [0, 1], got {value}")
    return (1.0 - prompt_prune_rate) * (f + (1.0 - f) * (1.0 - completion_prune_rate))


def rollout_step_ratio(f: float, rollout: float, completion_prune_rate: float) -> float:
    """Lower bound of T_arm / T_baseline from the rollout done: g * (f + (1 - f) * (1 - r_o)).

    rollout: g, the arm's samples generated per step / the baseline's (>= 0; above 1 where a step rolls
    out more than the baseline's); equal to ``ideal_step_ratio`` with 1 - r_q = g.
    """
    if not rollout >= 0.0:
        raise ValueError(f"g (samples generated per step / the baseline's) must be >= 0, got {rollout}")
    return ideal_step_ratio(f, 0.0, completion_prune_rate) * rollout


def lossless_time_ratio(shares: Sequence[float], step_times: Sequence[float]) -> float:
    """Item 4 over a run: sum_i T_i (1 - u_i) / sum_i T_i, u_i the step's share of all-equal-reward
    groups and T_i its step time (the oracle's training time over the run's own).

    In a run that prunes prompts u_i is a Horvitz-Thompson estimate, which can exceed 1 on a step (a
    draw that rolled out mostly all-equal groups kept with low q); it is unbiased, so it is taken as it
    is, not clipped (clipping would bias the run's figure). GRPO's u_i are shares, in [0, 1]."""
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
