"""The estimator's terms (docs/METHOD.md, "The estimator" and "When it is unbiased"): group advantages on
the full group (float64 statistics, returned in the input's dtype, at least float32), the importance
weights, the FULL batch's normalisers (never the kept count: biased), the step's reward statistics.
"""

from __future__ import annotations

import torch

from openrlhf_dppo.metric_keys import (
    COMPLETION_KEEP_FRAC,
    EQUAL_REWARD_FRAC,
    EQUAL_REWARD_FRAC_HT,
    NORMALIZER,
    PROMPT_KEEP_FRAC,
    REWARD_HT,
    REWARD_MEAN,
    REWARD_STD,
    WEIGHT_ESS,
    WEIGHT_ESS_FRAC,
    WEIGHT_MAX,
    WEIGHT_MEAN,
)

ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
#: estimators whose advantages are whitened over the rollout batch's tokens after the group step
BATCH_WHITENED = ("reinforce_baseline",)


def group_advantages(
    rewards: torch.Tensor, estimator: str = "group_norm", eps: float = 1e-9, unbiased_std: bool = True
) -> torch.Tensor:
    """rewards: (n_groups, G), row j the G rewards of prompt j -> advantages (n_groups, G) in the
    rewards' dtype, at least float32."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (n_groups, G), got {tuple(rewards.shape)}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")
    out = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(torch.float64)  # float64: docs/METHOD.md, "Departures from the paper", 9
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
    """(m, 1/s): REINFORCE++-baseline's token-level batch mean and inverse std from a weighted sample.

    values: (N,) per-token returns; weight: (N,) each token's 1 / (q_j p_ji) (0 for a filler or mask).
    returns: two 0-dim float64 tensors on ``values.device``: m = sum(w v) / sum(w) and
      1/s = clamp(sum(w (v - m)**2) / sum(w), 1e-8)**-1/2 (1 without ``std_norm``); (0, 1) when no weight
      is positive. OpenRLHF's statistics when every weight is 1; consistent under pruning (ratios of
      unbiased sums)."""
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


def inverse_prob_weights(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w = 1 / p on kept items, 0 elsewhere; p: ``sample_mask``'s p_used, mask: bool, alike.
    returns float64; raises if a kept item has p <= 0."""
    if p.shape != mask.shape:
        raise ValueError(f"p {tuple(p.shape)} and mask {tuple(mask.shape)} must have the same shape")
    p = p.to(torch.float64)
    if (mask & (p <= 0)).any():
        raise ValueError("a kept item has keep probability <= 0; its weight 1/p is undefined")
    return torch.where(mask, 1.0 / torch.where(mask, p, 1.0), 0.0)


def weight_metrics(weights: torch.Tensor) -> dict:
    """Mean, max, ESS = (sum w)^2 / sum w^2 (an item count) and ESS / n_kept of the KEPT items'
    weights (n_kept,) (pass ``w[mask]``)."""
    w = weights.detach().to(torch.float64).reshape(-1)
    if w.numel() == 0:
        return {WEIGHT_MEAN: 0.0, WEIGHT_MAX: 0.0, WEIGHT_ESS: 0.0, WEIGHT_ESS_FRAC: 0.0}
    ess = w.sum() ** 2 / (w * w).sum()
    return {
        WEIGHT_MEAN: as_float(w.mean()),
        WEIGHT_MAX: as_float(w.max()),
        WEIGHT_ESS: as_float(ess),
        WEIGHT_ESS_FRAC: as_float(ess / w.numel()),
    }


def fold_weights(adv: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A' = w * A. adv: (N,) or (N, T) per-token advantages; weights: (N,) -> same shape as adv,
    in adv's dtype."""
    if weights.dim() != 1 or weights.shape[0] != adv.shape[0]:
        raise ValueError(f"weights must have shape ({adv.shape[0]},), got {tuple(weights.shape)}")
    w = weights.to(adv.dtype)
    return adv * w.reshape((-1,) + (1,) * (adv.dim() - 1))


def weighted_aggregate(
    loss: torch.Tensor,
    loss_mask: torch.Tensor,
    weights: torch.Tensor,
    normalizer: float,
    token_level: bool = True,
    dp_size: int = 1,
) -> torch.Tensor:
    """Weighted reduction of a per-token term without A (KL-in-loss, entropy) by the full-batch normaliser:

        token_level:  sum_i w_i * sum_t loss_it * mask_it / normalizer * dp_size
        sequence:     sum_i w_i * (sum_t loss_it * mask_it / n_i) / normalizer * dp_size

    loss, loss_mask: (N, T); weights: (N,); dp_size undoes DeepSpeed's averaging over ranks.
    returns: a scalar tensor (differentiable in ``loss``)."""
    m = loss_mask.to(loss.dtype)
    w = weights.to(loss.dtype)
    if token_level:
        per_seq = (loss * m).sum(dim=-1)
    else:
        per_seq = (loss * m).sum(dim=-1) / (m.sum(dim=-1) + 1e-8)
    return (w * per_seq).sum() / normalizer * dp_size


def full_batch_normalizer(
    token_level: bool,
    num_prompts: float,
    group_size: int,
    prompt_weights: torch.Tensor | None = None,
    prompt_tokens: torch.Tensor | None = None,
) -> tuple[float, dict]:
    """The normaliser Z of the full (unpruned) batch -> (Z, {"dppo/normalizer": Z}).

    seq-mean: Z = num_prompts * group_size, num_prompts the prompts DRAWN (or the Horvitz-Thompson count).
    token_level: Z = sum_j prompt_weights_j * prompt_tokens_j over the rolled-out prompts, with
      prompt_weights (B_kept,) = 1 / q_j and prompt_tokens (B_kept,) all G completions' response tokens.
    """
    if not token_level:
        z = float(num_prompts * group_size)
    else:
        if prompt_weights is None or prompt_tokens is None:
            raise ValueError("a token-level normaliser needs prompt_weights and prompt_tokens")
        if prompt_weights.shape != prompt_tokens.shape:
            raise ValueError(
                f"prompt_weights {tuple(prompt_weights.shape)} and prompt_tokens "
                f"{tuple(prompt_tokens.shape)} must match"
            )
        z = as_float((prompt_weights.to(torch.float64) * prompt_tokens.to(torch.float64)).sum())
    return z, {NORMALIZER: z}


def as_float(x) -> float:
    """A detached Python float from a tensor (any shape with one element) or a number."""
    if isinstance(x, torch.Tensor):
        return float(x.detach().double().cpu().item())
    return float(x)


def keep_metrics(
    prompt_mask: torch.Tensor | None = None, completion_mask: torch.Tensor | None = None
) -> dict:
    """Realised kept fractions of the masks given (prompts (B,), completions (N,), bool)."""
    out = {}
    if prompt_mask is not None:
        out[PROMPT_KEEP_FRAC] = as_float(prompt_mask.float().mean()) if prompt_mask.numel() else 0.0
    if completion_mask is not None:
        out[COMPLETION_KEEP_FRAC] = (
            as_float(completion_mask.float().mean()) if completion_mask.numel() else 0.0
        )
    return out


def reward_stats(rewards: torch.Tensor, q: torch.Tensor | None = None, num_drawn: int | None = None) -> dict:
    """Training-reward statistics of one step (docs/METHOD.md, "The logged training reward").

    rewards: (n, G) RAW rewards; q: (n,) keep probabilities (None: 1); num_drawn: B_drawn >= n (None: n).
    returns: reward mean and std (unbiased) over the n G rollouts; ``rollout/reward_ht`` =
      sum_j (sum_i r_ji / q_j) / (B_drawn G) in float64; the share of all-equal groups and its estimate
      for the drawn batch, ``rollout/equal_reward_frac_ht`` = sum_j e_j / q_j / B_drawn.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (n, G), got {tuple(rewards.shape)}")
    r = rewards.detach().to(torch.float64)
    n, group = r.shape
    q = torch.ones(n, dtype=torch.float64) if q is None else q.detach().to(torch.float64).reshape(-1)
    num_drawn = n if num_drawn is None else num_drawn
    if q.shape != (n,):
        raise ValueError(f"q must have shape ({n},), got {tuple(q.shape)}")
    if n and not ((q > 0) & (q <= 1)).all():
        raise ValueError("prompt keep probabilities must lie in (0, 1]")
    if num_drawn < n:
        raise ValueError(f"num_drawn ({num_drawn}) must be >= the {n} rolled-out prompts")
    if n * group == 0:
        keys = (REWARD_MEAN, REWARD_STD, REWARD_HT, EQUAL_REWARD_FRAC, EQUAL_REWARD_FRAC_HT)
        return dict.fromkeys(keys, 0.0)
    sums = r.sum(dim=1)  # (n,)
    equal = (r == r[:, :1]).all(dim=1).to(torch.float64)  # (n,) 1 where the G rewards are all equal
    return {
        REWARD_MEAN: as_float(sums.sum() / (n * group)),
        REWARD_STD: as_float(r.std()) if n * group > 1 else 0.0,
        REWARD_HT: as_float((sums / q).sum() / (num_drawn * group)),
        EQUAL_REWARD_FRAC: as_float(equal.mean()),
        EQUAL_REWARD_FRAC_HT: as_float((equal / q).sum() / num_drawn),
    }
