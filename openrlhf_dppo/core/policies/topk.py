"""``topk`` (beyond the paper): keep the k largest |A| surely and draw every other completion at the floor.

The completions with the k largest |A| get p = 1; all others get p = p_min, the smallest probability
the estimator allows, and k is set by the budget: k + (m - k) p_min = K over the m completions that
may be kept, i.e. k = (K - m p_min) / (1 - p_min). A fractional k, and completions whose |A| ties the
boundary, share what is left of the budget equally, so p never decreases with |A| and the expected
kept count is K exactly. Unbiased like every policy: a kept completion is weighted by 1 / p.

Compared with ``uniform-low`` (its set of sure keeps is "|A| above the mean", a fixed threshold) the
sure set here grows and shrinks with the budget and the low set always sits at the floor, so its
weights 1 / p_min are as large as the floor allows.
"""

from __future__ import annotations

import torch

NAME = "topk"
HELP = "the k largest |A| kept (p = 1) and every other completion at the floor p_min, k set by the budget"

_TOL = 1e-9


def keep_probs(
    absA: torch.Tensor, zero: torch.Tensor, valid: torch.Tensor, p_min: float, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """absA, zero, valid: (R, N); budget: (R,) -> (p (R, N) float64, status (R,) int64); see the package."""
    A = absA.to(torch.float64)
    K = budget.to(torch.float64)
    keepable = valid & ~zero
    m = keepable.sum(dim=1).to(torch.float64)  # (R,) items that may be kept
    status = torch.where(K < m * p_min - _TOL, 1, torch.where(K > m + _TOL, 2, 0)).to(torch.int64)
    if A.shape[1] == 0:
        return A.clone(), status
    k = m if p_min >= 1.0 else (K - m * p_min) / (1.0 - p_min)
    k = torch.minimum(k.clamp_min(0.0), m)  # (R,) sure keeps, fractional
    # the boundary value t: the |A| at sorted position floor(k) (0-based, largest first)
    ranked = torch.where(keepable, A, torch.full_like(A, -1.0)).sort(dim=1, descending=True).values
    pos = torch.minimum(k.floor(), (m - 1).clamp_min(0)).to(torch.int64)
    t = ranked.gather(1, pos[:, None])  # (R, 1)
    above, tie = keepable & (A > t), keepable & (A == t)
    a, e = above.sum(dim=1).to(torch.float64), tie.sum(dim=1).to(torch.float64)
    # the tie group holds sure keeps k - a and floor items a + e - k: it shares their budget equally
    p_tie = ((k - a) + (a + e - k) * p_min) / e.clamp_min(1.0)
    floor = torch.where(keepable, torch.full_like(A, p_min), torch.zeros_like(A))  # float64, not float32
    p = torch.where(tie, p_tie[:, None], floor)
    return torch.where(above, torch.ones_like(A), p), status
