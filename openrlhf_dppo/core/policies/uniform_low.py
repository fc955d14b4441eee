"""``uniform-low``: the paper's reading of completion pruning.

Completions whose |A| is below the row's mean |A| (over the valid items, A == 0 included) form the
low-value set and share one keep probability 1 - r; all others keep p = 1, with r set by the budget. If
the low set alone cannot absorb the budget (its floor p_min is reached), the others are scaled down
uniformly too (beyond the paper, which does not say what happens then).

As a clipped scale (``solve_clipped_scale``): the low set has score 1 and the rest score 1 / p_min, so
the rest stay at p = 1 until the low set has reached its floor.
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale

NAME = "uniform-low"
HELP = "completions with |A| below the batch mean are pruned at one rate, the rest kept; the paper's"


def keep_probs(
    absA: torch.Tensor, zero: torch.Tensor, valid: torch.Tensor, p_min: float, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """absA, zero, valid: (R, N); budget: (R,) -> (p (R, N) float64, status (R,) int64); see the package."""
    n = valid.sum(dim=1, keepdim=True).clamp_min(1)
    mean_abs = torch.where(valid, absA, 0.0).sum(dim=1, keepdim=True) / n
    one = torch.ones_like(absA, dtype=torch.float64)
    s = torch.where(absA < mean_abs, one, one / p_min)
    s = torch.where(zero | ~valid, 0.0, s)
    return solve_clipped_scale(s, (valid & ~zero).to(torch.float64) * p_min, budget)
