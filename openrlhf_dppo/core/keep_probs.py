"""Keep probabilities for the two pruning levels (METHOD.md, "Level 1" and "Level 2").

Both levels spend a budget K = keep_frac * N of expected kept items. The prompt level and the policies
that scale a score solve  sum_i clip(c * s_i, lo_i, 1) = K  exactly (``clipped_scale``).

Completion level: the policy is a name in ``COMPLETION_POLICIES``, one module per policy in
``core/policies/`` (each says what it is and where it departs from the paper; ``python -m
openrlhf_dppo.cli.flags_table`` lists them). Every item has p >= p_min, except that with
``allow_zero=True`` an item with A == 0 exactly gets p = 0: that is only correct when the loss has no
KL-in-loss or entropy term (such a completion then has zero gradient). Its zero probability does not
count towards the budget, which stays keep_frac * N.

Prompt level: the policy is a name in ``PROMPT_POLICIES``, one module per policy in
``core/prompt_policies/`` (``proportional``, the default: q = clip(c * s, q_min, 1); ``sqrt``, the
variance-optimal rule at a fixed expected cost; ``uniform``, the equal-cost control), reading the
``PromptSignals`` the history gives before the rollout (``prompt_policy_keep_probs``).
``prompt_keep_probs`` is ``proportional`` on scores alone: a score of +inf marks a prompt never seen,
which is always kept (q = 1) and counts against the budget, unless an ``unseen_score`` is given: then it
takes that score and is drawn like the others (``--dppo.unseen_prompts mean``).

Infeasible budgets (reported, never silent):
- the floors alone exceed the budget (e.g. p_min > keep_frac): every item sits at its floor and the
  expected kept fraction is ABOVE the target;
- too few items can carry probability (e.g. allow_zero with fewer non-zero advantages than the
  budget, or too many unseen prompts): the carrying items get p = 1 (or unseen prompts keep q = 1)
  and the expected kept fraction is BELOW (resp. above) the target.
Metrics ``dppo/{level}_keep_frac_expected`` (sum p / N) and ``dppo/{level}_keep_infeasible`` (1.0
when the target could not be met) say which. Unbiasedness holds in every case since every
probability used is > 0 where the gradient may be non-zero.

Shapes: the functions take (N,) or (R, N); with two dimensions every row is an independent problem
(used by the vectorised Monte-Carlo tests) and the metrics are averaged over rows. An optional
``valid`` mask of the same shape removes items from a row (p = 0, not counted in N).
"""

from __future__ import annotations

import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale
from openrlhf_dppo.core.history import PromptSignals
from openrlhf_dppo.core.metrics import as_float
from openrlhf_dppo.core.policies import COMPLETION_POLICIES
from openrlhf_dppo.core.prompt_policies import PROMPT_POLICIES
from openrlhf_dppo.metric_keys import (
    COMPLETION_KEEP_FRAC_EXPECTED,
    COMPLETION_KEEP_INFEASIBLE,
    COMPLETION_ZERO_ADV_FRAC,
    PROMPT_KEEP_FRAC_EXPECTED,
    PROMPT_KEEP_INFEASIBLE,
    PROMPT_UNSEEN_FRAC,
)


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


def completion_keep_probs(
    adv: torch.Tensor,
    keep_frac: float,
    policy: str = "uniform-low",
    p_min: float = 0.1,
    allow_zero: bool = False,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Keep probability per completion, expected kept count == keep_frac * N exactly when feasible.

    adv: (N,) or (R, N) one scalar advantage per completion (the full-group advantage).
    keep_frac: 1 - completion_prune_rate, in (0, 1].
    policy: a name in ``COMPLETION_POLICIES``.
    p_min: floor in (0, 1] for every item whose gradient may be non-zero.
    allow_zero: items with A == 0 exactly get p = 0 (only valid without KL-in-loss / entropy terms).
    valid: optional bool mask like ``adv``; invalid items get p = 0 and are not counted in N.
    returns: p float64 like ``adv``; metrics ``dppo/completion_keep_frac_expected``,
      ``dppo/completion_keep_infeasible``, ``dppo/completion_zero_adv_frac``.
    """
    _check_frac(keep_frac, p_min, "p_min")
    fn = COMPLETION_POLICIES.get(policy)
    A = _as_rows(adv, "adv").to(torch.float64)
    v = torch.ones_like(A, dtype=torch.bool) if valid is None else _as_rows(valid, "valid").bool()
    if v.shape != A.shape:
        raise ValueError(f"valid {tuple(v.shape)} must match adv {tuple(A.shape)}")
    if not torch.isfinite(A[v]).all():
        raise ValueError("advantages must be finite")
    absA = A.abs()
    zero = (A == 0) & v if allow_zero else torch.zeros_like(v)
    n = v.sum(dim=1)
    p, status = fn(absA, zero, v, p_min, keep_frac * n.to(torch.float64))
    p = torch.where(v, p, 0.0)
    metrics = _level_metrics(p, n, status, COMPLETION_KEEP_FRAC_EXPECTED, COMPLETION_KEEP_INFEASIBLE)
    metrics[COMPLETION_ZERO_ADV_FRAC] = as_float(((A == 0) & v).sum() / n.sum().clamp_min(1))
    return p.reshape(adv.shape), metrics


def prompt_keep_probs(
    scores: torch.Tensor,
    keep_frac: float,
    q_min: float = 0.1,
    valid: torch.Tensor | None = None,
    unseen_score: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """Keep probability per drawn prompt: q = clip(c * s, q_min, 1), expected kept == keep_frac * B (the
    ``proportional`` prompt policy on scores alone).

    scores: (B,) or (R, B), s >= 0 from ``PromptHistory.score``; +inf marks an unseen prompt (q = 1).
    keep_frac: 1 - prompt_prune_rate, in (0, 1].  q_min: floor in (0, 1].
    unseen_score: None (unseen prompts keep q = 1), or a finite score >= 0 that unseen prompts take
      instead (``PromptHistory.mean_seen_score``); they still count in ``dppo/prompt_unseen_frac``.
    returns: q float64 like ``scores``; metrics ``dppo/prompt_keep_frac_expected``,
      ``dppo/prompt_keep_infeasible``, ``dppo/prompt_unseen_frac``.
    """
    signals = PromptSignals.of_scores(scores, unseen_score)
    return prompt_policy_keep_probs(signals, keep_frac, "proportional", q_min, valid)


def prompt_policy_keep_probs(
    signals: PromptSignals,
    keep_frac: float,
    policy: str = "proportional",
    q_min: float = 0.1,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Keep probability per drawn prompt under a policy of ``PROMPT_POLICIES``.

    signals: ``PromptHistory.signals(idx, G, estimator, unseen)`` (fields (B,) or (R, B)), made before the
      step's rollout.  keep_frac: 1 - r_q from the rate control, in (0, 1].  q_min: floor in (0, 1].
    returns: q float64 like ``signals.score``; metrics ``dppo/prompt_keep_frac_expected``,
      ``dppo/prompt_keep_infeasible``, ``dppo/prompt_unseen_frac``.
    """
    _check_frac(keep_frac, q_min, "q_min")
    fn = PROMPT_POLICIES.get(policy)
    shape = signals.score.shape
    sig = PromptSignals(*(_as_rows(torch.as_tensor(x), "signals") for x in signals))
    if any(x.shape != sig.score.shape for x in sig):
        raise ValueError(f"prompt signals must share one shape, got {[tuple(x.shape) for x in sig]}")
    sig = sig._replace(unseen=sig.unseen.bool(), pinned=sig.pinned.bool())
    v = torch.ones_like(sig.unseen) if valid is None else _as_rows(valid, "valid").bool()
    if v.shape != sig.score.shape:
        raise ValueError(f"valid {tuple(v.shape)} must match the signals {tuple(sig.score.shape)}")
    free = v & ~sig.pinned
    for name in ("score", "moment"):
        x = getattr(sig, name)[free]
        if not (torch.isfinite(x).all() and (x >= 0).all()):
            raise ValueError(f"prompt signal {name} must be finite and >= 0 on every prompt not pinned")
    if not (torch.isfinite(sig.cost[v]).all() and (sig.cost[v] > 0).all()):
        raise ValueError("prompt signal cost must be finite and > 0")
    q, status = fn(sig, v, q_min, keep_frac)
    q = torch.where(v, q, 0.0)
    n = v.sum(dim=1)
    metrics = _level_metrics(q, n, status, PROMPT_KEEP_FRAC_EXPECTED, PROMPT_KEEP_INFEASIBLE)
    metrics[PROMPT_UNSEEN_FRAC] = as_float((sig.unseen & v).sum() / n.sum().clamp_min(1))
    return q.reshape(shape), metrics


def _level_metrics(
    p: torch.Tensor, n: torch.Tensor, status: torch.Tensor, expected_key: str, infeasible_key: str
) -> dict:
    expected = p.sum(dim=1) / n.clamp_min(1)
    return {
        expected_key: as_float(expected.mean()),
        infeasible_key: as_float((status != 0).double().mean()),
    }


__all__ = [
    "COMPLETION_POLICIES",
    "PROMPT_POLICIES",
    "completion_keep_probs",
    "prompt_keep_probs",
    "prompt_policy_keep_probs",
    "solve_clipped_scale",
]
