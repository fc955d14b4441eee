"""The one solve behind every keep probability (METHOD.md, "Level 1" and "Level 2").

Given non-negative scores s_i, floors lo_i and a budget K, find the scale c with
sum_i clip(c * s_i, lo_i, 1) = K  and return p_i = clip(c * s_i, lo_i, 1). The left side is piecewise
linear and non-decreasing in c, so ``solve_clipped_scale`` finds c EXACTLY (up to float64 rounding) from
the sorted breakpoints instead of by bisection: same answer as a bisection run to convergence
(``tests/core/test_keep_probs.py`` checks this against a bisection reference), in one vectorised pass.
Used by both levels' keep probabilities and by the fixed-size rescale of ``sampling``.
"""

from __future__ import annotations

import torch

_TOL = 1e-9


def solve_clipped_scale(
    s: torch.Tensor, lo: torch.Tensor, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise exact solve of  sum_i clip(c * s_i, lo_i, 1) = budget.

    s: (R, N) float, s >= 0;  lo: (R, N) float in [0, 1];  budget: (R,) float.
    Items with s = 0 sit at lo_i; only when the budget exceeds what the scored items can carry (all
    at 1) do the items with s = 0 and lo_i > 0 rise together (a second solve with score 1 each).
    returns: p (R, N) float64 with rows summing to budget (up to rounding), and status (R,) int64:
      0 target met; 1 budget below sum(lo) (p = lo, more kept than asked);
      2 budget above the maximum (every item with s > 0 or lo > 0 at 1; fewer kept than asked).
    """
    s = s.to(torch.float64)
    lo = lo.to(torch.float64).clamp(0.0, 1.0)
    budget = budget.to(torch.float64)
    R, N = s.shape
    if N == 0:
        return s.clone(), torch.where(budget > _TOL, 2, 0).to(torch.int64)
    pos = s > 0
    safe = torch.where(pos, s, torch.ones_like(s))
    # breakpoints: item i enters its linear part at a_i = lo_i / s_i and saturates at b_i = 1 / s_i
    a = torch.where(pos, lo / safe, torch.zeros_like(s))
    b = torch.where(pos, 1.0 / safe, torch.zeros_like(s))
    top = b.amax(dim=1, keepdim=True)
    # items without a linear part (s == 0) get a zero-slope event at the last breakpoint (finite)
    a = torch.where(pos, a, top.expand_as(a))
    b = torch.where(pos, b, top.expand_as(b))
    ds = torch.where(pos, s, torch.zeros_like(s))
    t = torch.cat([a, b], dim=1)  # (R, 2N)
    d = torch.cat([ds, -ds], dim=1)
    t, order = t.sort(dim=1, stable=True)
    d = d.gather(1, order)
    slope = d.cumsum(dim=1).clamp_min(0.0)  # slope of f just after each breakpoint
    f0 = lo.sum(dim=1, keepdim=True)
    gaps = torch.diff(t, dim=1)
    f = torch.cat([f0, f0 + (slope[:, :-1] * gaps).cumsum(dim=1)], dim=1)  # f at each breakpoint
    fmax = f[:, -1]
    k = torch.searchsorted(f.contiguous(), budget[:, None].contiguous(), right=True) - 1
    k = k.clamp(0, 2 * N - 1)
    tk, fk, sk = t.gather(1, k), f.gather(1, k), slope.gather(1, k)
    c = torch.where(sk > 0, tk + (budget[:, None] - fk) / torch.where(sk > 0, sk, 1.0), tk)
    below = budget < f0[:, 0] - _TOL
    above = budget > fmax + _TOL
    c = torch.where(below[:, None], torch.zeros_like(c), c)
    c = torch.where(above[:, None], top, c)
    p = torch.minimum(torch.maximum(c * s, lo), torch.ones_like(s))
    p = torch.where(pos, p, lo)
    status = torch.zeros(R, dtype=torch.int64)
    status[below] = 1
    status[above] = 2
    # second tier: a budget above what the scored items carry (all at 1) goes to the items that have
    # a floor but no score (a score-0 prompt): they rise together
    floor_only = ~pos & (lo > 0)
    spill = above & floor_only.any(dim=1)
    if spill.any():
        rest = budget - pos.sum(dim=1).to(torch.float64)
        p2, status2 = solve_clipped_scale(
            floor_only.to(torch.float64), torch.where(floor_only, lo, 0.0), rest
        )
        p = torch.where(spill[:, None] & floor_only, p2, p)
        status = torch.where(spill, status2, status)
    return p, status
