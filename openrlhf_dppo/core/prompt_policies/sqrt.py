"""``sqrt`` (beyond the paper; METHOD.md "Choosing q: the variance-optimal rule"):
q_j = clip(lambda sqrt(E[v_j] / c_j), q_min, 1), lambda set so that the expected COST sum_j c_j q_j is
keep_frac * sum_j c_j.

Derivation. The prompt draw adds to the Horvitz-Thompson estimate the variance sum_j v_j (1 / q_j - 1),
v_j the second moment of prompt j's contribution; rolling out prompt j costs c_j (its expected response
tokens). Minimise sum_j v_j / q_j subject to sum_j c_j q_j = C and q_min <= q_j <= 1: the Lagrangian
sum_j v_j / q_j + mu (sum_j c_j q_j - C) is stationary where -v_j / q_j^2 + mu c_j = 0, i.e.
q_j = sqrt(v_j / (mu c_j)) = lambda sqrt(v_j / c_j), and the convex objective makes the clipped point the
minimum (the Horvitz-Thompson optimal design; importance sampling for SGD: Zhao & Zhang 2015,
Katharopoulos & Fleuret 2018; optimal Poisson subsampling: Wang & Zou 2021). v_j is not known before
the rollout, but the expected variance is linear in v_j, so its posterior mean E[v_j] goes under the
root (``PromptHistory.moment``): for group_norm with binary rewards P(G samples not all equal) under the
discounted Beta(a, b) posterior, 1 - prod_{i<G} (a+i)/(a+b+i) - prod_{i<G} (b+i)/(a+b+i); for the other
estimators E[p (1 - p)]; for group_norm with continuous rewards the posterior P(not all equal) from the
prompt's count of mixed groups (its squared advantages sum to about G however small the spread); for the
other estimators with continuous rewards the estimated variance. ``proportional``'s q ~ s is this
rule's square: it over-skews.

Budget. keep_frac * sum_j c_j over the valid prompts: the cost a uniform draw at keep_frac spends
(``uniform``), so the rate control sets a cost, not a count. It equals keep_frac * B prompts only when the
costs are equal (unseen histories, or no recorded lengths: every c = 1); otherwise cheap prompts are
kept more often and the expected kept count ``dppo/prompt_keep_frac_expected`` moves off keep_frac. A
fixed-size design then moves sum_j q_j to the nearest integer (``sampling.fixed_size_probs``) and the
weights use those probabilities. Pinned prompts keep q = 1 and their cost counts against the budget.
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale

NAME = "sqrt"
HELP = (
    "q = clip(lambda sqrt(E[v] / c), q_min, 1), E[v] the posterior mean of the group's gradient second "
    "moment and c its expected tokens, at an expected cost keep_frac x the batch's; variance-optimal"
)


def keep_probs(sig, valid: torch.Tensor, q_min: float, keep_frac: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sig: PromptSignals of (R, B); valid: (R, B) -> (q (R, B) float64, status (R,) int64); see the package."""
    free = valid & ~sig.pinned
    cost = torch.where(valid, sig.cost.to(torch.float64), 1.0)
    x = torch.where(free, (sig.moment.to(torch.float64) / cost).clamp_min(0.0).sqrt(), 0.0)
    lo = torch.where(sig.pinned & valid, 1.0, valid.to(torch.float64) * q_min)
    budget = keep_frac * torch.where(valid, cost, 0.0).sum(dim=1)
    return solve_clipped_scale(x, lo, budget, weight=cost)
