"""``proportional`` (the paper's shape, METHOD.md "Level 1"): q = clip(c s, q_min, 1) over the history's
score s, c set so that the expected kept COUNT is keep_frac * B (the budget counts prompts, not tokens).

Pinned prompts (unseen under ``--dppo.unseen_prompts keep``) keep q = 1 and count against the budget.
It is the square of the variance-optimal rule when s is E[v] and costs are equal (``sqrt``): it
over-skews, and a mispredicted prompt at q_min costs its weight 1 / q_min in variance.
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale

NAME = "proportional"
HELP = (
    "q = clip(c s, q_min, 1) over the history's score s, at an expected kept count keep_frac B; the default"
)


def keep_probs(sig, valid: torch.Tensor, q_min: float, keep_frac: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sig: PromptSignals of (R, B); valid: (R, B) -> (q (R, B) float64, status (R,) int64); see the package."""
    free = valid & ~sig.pinned
    s = torch.where(free, sig.score, 0.0).to(torch.float64)
    lo = torch.where(sig.pinned & valid, 1.0, valid.to(torch.float64) * q_min)
    return solve_clipped_scale(s, lo, keep_frac * valid.sum(dim=1).to(torch.float64))
