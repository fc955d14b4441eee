"""Group advantages on the FULL group (METHOD.md, "Notation").

Implemented, for rewards of shape (n_groups, G):

    group_norm:  A = (r - mean) / (std + eps)     std unbiased (Bessel) by default, eps = 1e-9
    dr_grpo:     A = r - mean

With the defaults these are OpenRLHF 0.11.2's formulas (``experience_maker.py``, the ``group_norm`` and
``dr_grpo`` branches), taken in float64 and returned in the input's dtype (at least float32).
Departures: (1) the float64 statistics. OpenRLHF takes them in float32, where a group whose rewards are
all equal but not exactly representable (countdown's 0.05 for a wrong answer) has a mean off by a few
1e-9 and a std of the same size, so group_norm gives every member an advantage of order 1 and the same
sign (-0.75 for eight rewards of 0.05). In float64 the sum of G float32 values is exact, the mean is the
value, and the advantage is 0 exactly, as in exact arithmetic (the sum of G <= 2**29 float32 values
is exact in float64). The GRPO arm's experience maker
(``adapters.experience_maker.CountingExperienceMaker``) takes OpenRLHF's statistics in float64 too, so
both arms compute the same advantages. (2) A group of one (G == 1) gets advantage 0 (there is no
baseline); OpenRLHF would produce NaN there from the unbiased std of one value.

The advantages must be computed BEFORE completion pruning, on every rolled-out completion: the baseline
needs every reward of the group.
"""

from __future__ import annotations

import torch

ESTIMATORS = ("group_norm", "dr_grpo")


def group_advantages(
    rewards: torch.Tensor, estimator: str = "group_norm", eps: float = 1e-9, unbiased_std: bool = True
) -> torch.Tensor:
    """Per-completion advantages from the rewards of whole groups.

    rewards: (n_groups, G) floating point; row j holds the G rewards of prompt j.
    returns: (n_groups, G), same dtype (at least float32, as OpenRLHF promotes rewards to float32).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (n_groups, G), got {tuple(rewards.shape)}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")
    out = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(torch.float64)  # float64 statistics: see the module docstring
    if r.shape[1] <= 1:
        return torch.zeros_like(r, dtype=out)  # (n_groups, 1): no baseline in a group of one
    centred = r - r.mean(-1, keepdim=True)
    if estimator == "dr_grpo":
        return centred.to(out)  # (n_groups, G)
    std = r.std(-1, keepdim=True, correction=1 if unbiased_std else 0)
    return (centred / (std + eps)).to(out)  # (n_groups, G)
