"""Keep probabilities for the two pruning levels (METHOD.md, "Level 1" and "Level 2").

Both levels spend a budget K = keep_frac * N of expected kept items, solving
sum_i clip(c * s_i, lo_i, 1) = K exactly (``clipped_scale``).

Completion level (``completion_keep_probs``): the paper's uniform-low rule. Completions whose |A| is below
the row's mean |A| (over the valid items, A == 0 included) form the low-value set and share one keep
probability; all others keep p = 1. If the low set alone cannot absorb the budget (its floor p_min is
reached), the others are scaled down uniformly too (beyond the paper, which does not say what happens
then). With ``allow_zero=True`` an item with A == 0 exactly gets p = 0: only correct when the loss has no
KL-in-loss or entropy term (such a completion then has zero gradient); its zero probability does not count
towards the budget, which stays keep_frac * N.

Prompt level (``prompt_keep_probs``): a policy of ``PROMPT_POLICIES`` over the history's scores
(``PromptHistory.signals``: an unseen prompt already carries the mean seen score):
- ``proportional`` (the paper's shape): q = clip(c * s, q_min, 1);
- ``uniform`` (the equal-cost control): q = keep_frac for every prompt, whatever its history.

Infeasible budgets (reported, never silent):
- the floors alone exceed the budget (e.g. p_min > keep_frac): every item sits at its floor and the
  expected kept fraction is ABOVE the target;
- too few items can carry probability (e.g. allow_zero with fewer non-zero advantages than the budget):
  the carrying items get p = 1 and the expected kept fraction is BELOW the target.
Metrics ``dppo/{level}_keep_frac_expected`` (sum p / N) and ``dppo/{level}_keep_infeasible`` (1.0 when the
target could not be met) say which. Unbiasedness holds in every case since every probability used is > 0
where the gradient may be non-zero.

Shapes: the functions take (N,) or (R, N); with two dimensions every row is an independent problem (used
by the vectorised Monte-Carlo tests) and the metrics are averaged over rows. An optional ``valid`` mask of
the same shape removes items from a row (p = 0, not counted in N).
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale
from openrlhf_dppo.core.metrics import as_float
from openrlhf_dppo.core.registry import Registry
from openrlhf_dppo.metric_keys import (
    COMPLETION_KEEP_FRAC_EXPECTED,
    COMPLETION_KEEP_INFEASIBLE,
    COMPLETION_ZERO_ADV_FRAC,
    PROMPT_KEEP_FRAC_EXPECTED,
    PROMPT_KEEP_INFEASIBLE,
    PROMPT_UNSEEN_FRAC,
)

#: prompt keep-probability policies: fn(score (R, B) float64 >= 0, valid (R, B) bool, q_min, keep_frac)
#: -> (q (R, B) float64 in [q_min, 1] on valid prompts, 0 elsewhere; status (R,) as solve_clipped_scale's)
PROMPT_POLICIES = Registry("prompt keep-probability policy")


@PROMPT_POLICIES.register("proportional")
def proportional(score: torch.Tensor, valid: torch.Tensor, q_min: float, keep_frac: float):
    """q = clip(c s, q_min, 1), c set so that the expected kept count is keep_frac * B."""
    s = torch.where(valid, score, 0.0).to(torch.float64)
    lo = valid.to(torch.float64) * q_min
    return solve_clipped_scale(s, lo, keep_frac * valid.sum(dim=1).to(torch.float64))


@PROMPT_POLICIES.register("uniform")
def uniform(score: torch.Tensor, valid: torch.Tensor, q_min: float, keep_frac: float):
    """q = keep_frac on every valid prompt (the floor q_min <= keep_frac is the config's check)."""
    v = valid.to(torch.float64)
    return solve_clipped_scale(v, v * q_min, keep_frac * v.sum(dim=1))


def uniform_low(
    absA: torch.Tensor, zero: torch.Tensor, valid: torch.Tensor, p_min: float, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The completion rule (module docstring). absA, zero, valid: (R, N); budget: (R,) expected kept count.
    As a clipped scale: the low set has score 1 and the rest score 1 / p_min, so the rest stay at p = 1
    until the low set has reached its floor. -> (p (R, N) float64, status (R,) int64)."""
    n = valid.sum(dim=1, keepdim=True).clamp_min(1)
    mean_abs = torch.where(valid, absA, 0.0).sum(dim=1, keepdim=True) / n
    one = torch.ones_like(absA, dtype=torch.float64)
    s = torch.where(absA < mean_abs, one, one / p_min)
    s = torch.where(zero | ~valid, 0.0, s)
    return solve_clipped_scale(s, (valid & ~zero).to(torch.float64) * p_min, budget)


def _as_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() == 1:
        return x[None]
    if x.dim() == 2:
        return x
    raise ValueError(f"{name} must have shape (N,) or (R, N), got {tuple(x.shape)}")


def _check_frac(keep_frac: float, floor: float, floor_name: str) -> None:
    if not 0.0 < keep_frac <= 1.0:
        raise ValueError(f"keep_frac must be in (0, 1], got {keep_frac}")
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"{floor_name} must be in (0, 1], got {floor}")


def _valid(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    v = torch.ones_like(like, dtype=torch.bool) if valid is None else _as_rows(valid, "valid").bool()
    if v.shape != like.shape:
        raise ValueError(f"valid {tuple(v.shape)} must match {tuple(like.shape)}")
    return v


def completion_keep_probs(
    adv: torch.Tensor,
    keep_frac: float,
    p_min: float = 0.1,
    allow_zero: bool = False,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Keep probability per completion, expected kept count == keep_frac * N exactly when feasible.

    adv: (N,) or (R, N) one scalar advantage per completion (the full-group advantage).
    keep_frac: 1 - completion_prune_rate, in (0, 1].  p_min: floor in (0, 1] for every item whose gradient
    may be non-zero.  allow_zero: items with A == 0 exactly get p = 0 (only valid without KL-in-loss /
    entropy terms).  valid: optional bool mask like ``adv``; invalid items get p = 0, not counted in N.
    returns: p float64 like ``adv``; metrics ``dppo/completion_keep_frac_expected``,
      ``dppo/completion_keep_infeasible``, ``dppo/completion_zero_adv_frac``.
    """
    _check_frac(keep_frac, p_min, "p_min")
    A = _as_rows(adv, "adv").to(torch.float64)
    v = _valid(valid, A)
    if not torch.isfinite(A[v]).all():
        raise ValueError("advantages must be finite")
    zero = (A == 0) & v if allow_zero else torch.zeros_like(v)
    n = v.sum(dim=1)
    p, status = uniform_low(A.abs(), zero, v, p_min, keep_frac * n.to(torch.float64))
    p = torch.where(v, p, 0.0)
    metrics = _level_metrics(p, n, status, COMPLETION_KEEP_FRAC_EXPECTED, COMPLETION_KEEP_INFEASIBLE)
    metrics[COMPLETION_ZERO_ADV_FRAC] = as_float(((A == 0) & v).sum() / n.sum().clamp_min(1))
    return p.reshape(adv.shape), metrics


def prompt_keep_probs(
    scores: torch.Tensor,
    keep_frac: float,
    q_min: float = 0.1,
    policy: str = "proportional",
    valid: torch.Tensor | None = None,
    unseen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Keep probability per drawn prompt under a policy of ``PROMPT_POLICIES``, expected kept count
    keep_frac * B exactly when feasible.

    scores: (B,) or (R, B) finite s >= 0 (``PromptHistory.signals``).  keep_frac: 1 - r_q from the rate
    control, in (0, 1].  q_min: floor in (0, 1].  unseen: optional bool like ``scores``, the prompts never
    rolled out (only counted in ``dppo/prompt_unseen_frac``).
    returns: q float64 like ``scores``; metrics ``dppo/prompt_keep_frac_expected``,
      ``dppo/prompt_keep_infeasible``, ``dppo/prompt_unseen_frac``.
    """
    _check_frac(keep_frac, q_min, "q_min")
    fn = PROMPT_POLICIES.get(policy)
    s = _as_rows(torch.as_tensor(scores), "scores").to(torch.float64)
    v = _valid(valid, s)
    if not (torch.isfinite(s[v]).all() and (s[v] >= 0).all()):
        raise ValueError("prompt scores must be finite and >= 0")
    q, status = fn(s, v, q_min, keep_frac)
    q = torch.where(v, q, 0.0)
    n = v.sum(dim=1)
    metrics = _level_metrics(q, n, status, PROMPT_KEEP_FRAC_EXPECTED, PROMPT_KEEP_INFEASIBLE)
    new = torch.zeros_like(v) if unseen is None else _as_rows(torch.as_tensor(unseen), "unseen").bool()
    metrics[PROMPT_UNSEEN_FRAC] = as_float((new & v).sum() / n.sum().clamp_min(1))
    return q.reshape(torch.as_tensor(scores).shape), metrics


def _level_metrics(
    p: torch.Tensor, n: torch.Tensor, status: torch.Tensor, expected_key: str, infeasible_key: str
) -> dict:
    expected = p.sum(dim=1) / n.clamp_min(1)
    return {
        expected_key: as_float(expected.mean()),
        infeasible_key: as_float((status != 0).double().mean()),
    }


__all__ = ["PROMPT_POLICIES", "completion_keep_probs", "prompt_keep_probs", "solve_clipped_scale"]
