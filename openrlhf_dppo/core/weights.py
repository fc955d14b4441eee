"""Importance weights and normalisers (METHOD.md, "The unbiased estimator", conditions 1-4).

A kept prompt j gets w_j = 1 / q_j, a kept completion v_ji = 1 / p_ji; the weight of a kept item is
w_j * v_ji and E[w_j v_ji] = 1 for every (j, i) (tower property: the prompt mask depends only on the
history, the completion mask is drawn given the rollouts). The estimator

    g_hat = (1 / Z) * sum over kept (j, i) of  w_j * v_ji * grad l_ji

is unbiased for the full-batch gradient when Z is the FULL-batch normaliser:
- seq-mean: Z = B * G with B the number of prompts DRAWN (before prompt pruning);
- token-mean: the Horvitz-Thompson estimate Z_hat = sum over rolled-out prompts of
  w_j * T_j, with T_j the response tokens of ALL G completions of prompt j (pruned completions were
  generated, so T_j is known). Z_hat is unbiased for the full token count, but g_hat / Z_hat is a ratio
  and therefore only consistent, not exactly unbiased. With no prompt pruning Z_hat is exact.
Dividing by the kept count is biased: never do it (the negative control in the tests catches it).

Folding w_j * v_ji into the advantage reproduces the weighted policy loss exactly for PPO clip, dual
clip, GSPO and rollout IS corrections, because clipping depends on the sign of A, not its size (w > 0).
KL-in-loss and entropy terms contain no A and must be weighted separately: ``weighted_aggregate``.
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.metrics import as_float
from openrlhf_dppo.metric_keys import NORMALIZER, WEIGHT_ESS, WEIGHT_ESS_FRAC, WEIGHT_MAX, WEIGHT_MEAN


def inverse_prob_weights(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w = 1 / p on kept items, 0 on dropped ones.

    p: (...) probabilities actually used for the draw (``sample_mask``'s p_used); mask: (...) bool.
    returns: (...) float64. Raises if a kept item has p <= 0 (it could never have been drawn).
    """
    if p.shape != mask.shape:
        raise ValueError(f"p {tuple(p.shape)} and mask {tuple(mask.shape)} must have the same shape")
    p = p.to(torch.float64)
    if (mask & (p <= 0)).any():
        raise ValueError("a kept item has keep probability <= 0; its weight 1/p is undefined")
    return torch.where(mask, 1.0 / torch.where(mask, p, 1.0), 0.0)


def combine_weights(prompt_weights: torch.Tensor, completion_weights: torch.Tensor) -> torch.Tensor:
    """Item weight w_j * v_ji. prompt_weights: (B,); completion_weights: (B, G) -> (B, G)."""
    if completion_weights.dim() != 2 or completion_weights.shape[0] != prompt_weights.shape[0]:
        raise ValueError(
            f"expected prompt_weights (B,) and completion_weights (B, G), got "
            f"{tuple(prompt_weights.shape)} and {tuple(completion_weights.shape)}"
        )
    return prompt_weights.to(torch.float64)[:, None] * completion_weights.to(torch.float64)


def weight_metrics(weights: torch.Tensor) -> dict:
    """Mean, max and effective sample size (sum w)^2 / sum w^2 of the weights of the KEPT items.

    weights: (n_kept,) positive (pass ``w[mask]``). ESS is an item count (n_kept when all weights are
    equal); ``dppo/weight_ess_frac`` is ESS / n_kept.
    """
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
    """Weighted reduction of a per-token term without A (KL-in-loss, entropy), same modes as
    OpenRLHF's ``aggregate_loss`` but divided by the full-batch normaliser:

        token_level:  sum_i w_i * sum_t loss_it * mask_it / normalizer * dp_size
        sequence:     sum_i w_i * (sum_t loss_it * mask_it / n_i) / normalizer * dp_size

    loss, loss_mask: (N, T); weights: (N,); normalizer: the global Z (``full_batch_normalizer``);
    dp_size compensates DeepSpeed's averaging of gradients over ranks (as in OpenRLHF).
    returns: a scalar tensor (differentiable in ``loss``).
    """
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
    """The normaliser Z of the full (unpruned) batch.

    token_level False (seq-mean): Z = num_prompts * group_size, num_prompts = prompts DRAWN (a count;
      for a filtered subset the Horvitz-Thompson count sum_j 1 / q_j, not a whole number).
    token_level True: Z = sum_j prompt_weights_j * prompt_tokens_j over the rolled-out prompts;
      prompt_weights (B_kept,) = 1 / q_j; prompt_tokens (B_kept,) = response tokens of all G
      completions of prompt j (pruned completions included).
    returns: (Z, {"dppo/normalizer": Z}).
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
