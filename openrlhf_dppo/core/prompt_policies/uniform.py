"""``uniform`` (the equal-cost control, METHOD.md "Measuring the promise"): q = keep_frac for every valid
prompt, whatever the history says: the same rate control, the same draw and weights 1 / q as DPPO's
other policies, so an arm with it differs from DPPO in the selection alone. Under Adam and a full-batch
normaliser a constant weight makes it a smaller GRPO batch.

Its budget is the expected kept count keep_frac * B, as ``proportional``'s: pinned prompts (unseen under
``--dppo.unseen_prompts keep``) keep q = 1 and count against it, the others share the rest equally
(q = keep_frac exactly when nothing is pinned).
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale

NAME = "uniform"
HELP = (
    "q = keep_frac for every prompt whatever its history; the equal-cost control, a smaller batch at random"
)


def keep_probs(sig, valid: torch.Tensor, q_min: float, keep_frac: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sig: PromptSignals of (R, B); valid: (R, B) -> (q (R, B) float64, status (R,) int64); see the package."""
    free = (valid & ~sig.pinned).to(torch.float64)
    lo = torch.where(sig.pinned & valid, 1.0, valid.to(torch.float64) * q_min)
    return solve_clipped_scale(free, lo, keep_frac * valid.sum(dim=1).to(torch.float64))
