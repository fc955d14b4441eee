"""Group advantages on the FULL group (METHOD.md, "Notation"), and REINFORCE++-baseline's batch statistics.

Implemented, for rewards of shape (n_groups, G):

    group_norm:          A = (r - mean) / (std + eps)     std unbiased (Bessel) by default, eps = 1e-9
    dr_grpo:             A = r - mean
    rloo:                A = r - (sum - r) / (G - 1)     the leave-one-out mean of the other G - 1
    reinforce_baseline:  A = r - mean, then (after the per-token returns are made) whitened over the
                         whole rollout batch's tokens: A' = (A_t - m) / s (``token_whitening``)

With the defaults these are OpenRLHF 0.11.2's formulas (``experience_maker.py``, the ``group_norm``,
``dr_grpo``, ``rloo`` and ``reinforce_baseline`` branches; the last whitens per token with the action-mask mean m and
the population std s, s**2 clamped at 1e-8, unless ``--algo.advantage.no_std_norm``), taken in float64 and returned in the input's dtype (at least float32).
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

ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
#: estimators whose advantages are whitened over the rollout batch's tokens after the group step
BATCH_WHITENED = ("reinforce_baseline",)


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
    if estimator == "rloo":
        return (r - (r.sum(-1, keepdim=True) - r) / (r.shape[1] - 1)).to(out)  # (n_groups, G)
    centred = r - r.mean(-1, keepdim=True)
    if estimator in ("dr_grpo", "reinforce_baseline"):
        return centred.to(out)  # (n_groups, G)
    std = r.std(-1, keepdim=True, correction=1 if unbiased_std else 0)
    return (centred / (std + eps)).to(out)  # (n_groups, G)


def token_whitening(
    values: torch.Tensor, weight: torch.Tensor, std_norm: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, 1/s): REINFORCE++-baseline's token-level batch mean and inverse std, estimated from a sample.

    values: (N,) per-token returns of the trained completions' response tokens, flattened.
    weight: (N,) each token's Horvitz-Thompson weight, 1 / (q_j p_ji) of its completion (0 for a
      zero-weight filler or a masked position).
    returns: two 0-dim float64 tensors on ``values.device``: m = sum(w v) / sum(w) and
      1/s = clamp(sum(w (v - m)**2) / sum(w), 1e-8)**-1/2 (1 without ``std_norm``).

    With every weight 1 (nothing pruned) these are OpenRLHF's statistics over the whole batch exactly. Under
    pruning the full batch's token sums are estimated by Horvitz-Thompson (each unbiased); m and s are
    ratios of such sums, so they are consistent (their error falls as 1/sqrt(batch)), not exactly unbiased.
    Given m and s, the reweighted gradient is unbiased for the full batch's at that (m, s): the exact part.
    A sample with no positive weight (only fillers) returns (0, 1).
    """
    if values.shape != weight.shape or values.dim() != 1:
        raise ValueError(
            f"values and weight must be (N,) alike, got {tuple(values.shape)}, {tuple(weight.shape)}"
        )
    v, w = values.to(torch.float64), weight.to(device=values.device, dtype=torch.float64)
    total = w.sum()
    if not bool(total > 0):
        zero = torch.zeros((), dtype=torch.float64, device=values.device)
        return zero, zero + 1.0
    mean = (w * v).sum() / total
    if not std_norm:
        return mean, torch.ones((), dtype=torch.float64, device=values.device)
    var = (w * (v - mean).pow(2)).sum() / total
    return mean, var.clamp(min=1e-8).rsqrt()  # 0-dim each
