"""Small metric helpers. Every core metric is a detached Python float under a key named in
``openrlhf_dppo.metric_keys`` (``dppo/...``; the reward statistics under OpenRLHF's ``rollout/...``)."""

from __future__ import annotations

from typing import Mapping

import torch

from openrlhf_dppo.metric_keys import (
    COMPLETION_KEEP_FRAC,
    EQUAL_REWARD_FRAC,
    EQUAL_REWARD_FRAC_HT,
    PROMPT_KEEP_FRAC,
    REQUIRED_KEYS,
    REWARD_HT,
    REWARD_MEAN,
    REWARD_STD,
)

__all__ = ["REQUIRED_KEYS", "as_float", "keep_metrics", "merge", "reward_stats"]


def as_float(x) -> float:
    """A detached Python float from a tensor (any shape with one element) or a number."""
    if isinstance(x, torch.Tensor):
        return float(x.detach().double().cpu().item())
    return float(x)


def keep_metrics(
    prompt_mask: torch.Tensor | None = None, completion_mask: torch.Tensor | None = None
) -> dict:
    """Realised kept fractions. ``prompt_mask`` (B,) bool over the drawn prompts; ``completion_mask``
    (N,) bool over the rolled-out completions. A level that is not given is not reported."""
    out = {}
    if prompt_mask is not None:
        out[PROMPT_KEEP_FRAC] = as_float(prompt_mask.float().mean()) if prompt_mask.numel() else 0.0
    if completion_mask is not None:
        out[COMPLETION_KEEP_FRAC] = (
            as_float(completion_mask.float().mean()) if completion_mask.numel() else 0.0
        )
    return out


def merge(*parts: Mapping[str, float]) -> dict:
    """Merge metric dicts; a key given twice must carry the same value (guards silent overwrites)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            if k in out and out[k] != v:
                raise ValueError(f"metric {k!r} given twice with different values ({out[k]} vs {v})")
            out[k] = v
    return out


def reward_stats(rewards: torch.Tensor, q: torch.Tensor | None = None, num_drawn: int | None = None) -> dict:
    """Training-reward statistics of one step (METHOD.md, "Measuring the promise").

    rewards: (n, G) RAW rewards (the reward function's, before any length penalty) of the n rolled-out
      prompts' groups, G completions each.
    q: (n,) the probability each rolled-out prompt was kept with (None: every q = 1, as in GRPO).
    num_drawn: B_drawn >= n, the prompts drawn before prompt pruning (None: n).
    returns: ``rollout/reward_mean`` and ``rollout/reward_std`` (unbiased) over the n * G rollouts, and
      the Horvitz-Thompson estimate of the DRAWN batch's mean reward
          ``rollout/reward_ht`` = (1 / B_drawn) * sum_j (1 / q_j) * mean_i r_ji,
      computed as sum_j (sum_i r_ji / q_j) / (B_drawn * G) in float64, and the mean as
      sum_j (sum_i r_ji) / (n * G): with every q = 1 and B_drawn = n the two are the same float;
      ``rollout/equal_reward_frac``, the share of the n groups whose G rewards are all equal (under a
      group estimator every advantage of such a group is 0, so it has no policy gradient), and its
      Horvitz-Thompson estimate for the drawn batch, ``rollout/equal_reward_frac_ht`` =
      (1 / B_drawn) * sum_j e_j / q_j with e_j = 1 for such a group: the share of GRPO's batch that
      an oracle could skip without changing the policy gradient (``openrlhf_dppo.report.lossless``).
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
