"""``proportional`` (beyond the paper): p = clip(lambda * |A|, p_min, 1), lambda set by the budget.

Variance-optimal for a fixed budget when the per-completion gradient norms are similar (the variance
of a Horvitz-Thompson sum, sum_i (1 / p_i - 1) x_i^2, is smallest for p_i proportional to |x_i|). Items
with A == 0 (kept at p_min) only rise above p_min once every other item is at 1 (e.g. keep_frac = 1
keeps everything).
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale

NAME = "proportional"
HELP = "p = clip(lambda |A|, p_min, 1), lambda set by the budget; variance-optimal for similar gradient norms"


def keep_probs(
    absA: torch.Tensor, zero: torch.Tensor, valid: torch.Tensor, p_min: float, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """absA, zero, valid: (R, N); budget: (R,) -> (p (R, N) float64, status (R,) int64); see the package."""
    s = torch.where(valid, absA, 0.0).to(torch.float64)
    return solve_clipped_scale(s, (valid & ~zero).to(torch.float64) * p_min, budget)
