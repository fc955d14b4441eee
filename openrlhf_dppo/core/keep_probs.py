"""Keep probabilities for the two pruning levels (docs/METHOD.md, "Prompt keep probabilities" and
"Completion pruning"), each budget K = keep_frac * N spent by one exact solve (``solve_clipped_scale``).
An infeasible budget is reported in the metrics; every probability is > 0 where the gradient may be
non-zero. Inputs (N,) or (R, N) (rows independent); ``valid`` removes items (p = 0, not counted in N).
"""

from __future__ import annotations

from typing import Callable, Iterator, TypeVar

import torch

from openrlhf_dppo.core.estimator import as_float
from openrlhf_dppo.metric_keys import (
    COMPLETION_KEEP_FRAC_EXPECTED,
    COMPLETION_KEEP_INFEASIBLE,
    COMPLETION_ZERO_ADV_FRAC,
    PROMPT_KEEP_FRAC_EXPECTED,
    PROMPT_KEEP_INFEASIBLE,
    PROMPT_UNSEEN_FRAC,
)

F = TypeVar("F", bound=Callable)


class Registry:
    """Maps a name to a callable. ``kind`` is only used in error messages."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@REG.register("name")``. Raises ``ValueError`` if the name is taken."""

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> Callable:
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}")
        return self._items[name]

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


_TOL = 1e-9


def solve_clipped_scale(
    s: torch.Tensor, lo: torch.Tensor, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise exact solve of  sum_i clip(c * s_i, lo_i, 1) = budget.

    s: (R, N) float, s >= 0;  lo: (R, N) float in [0, 1];  budget: (R,) float. Items with s = 0 sit at
    lo_i unless the scored items all at 1 cannot carry the budget (then those with lo_i > 0 rise together).
    returns: p (R, N) float64 with rows summing to budget (up to rounding), and status (R,) int64:
      0 target met; 1 budget below sum(lo) (p = lo, more kept than asked);
      2 budget above the maximum (every item with s > 0 or lo > 0 at 1; fewer kept than asked).
    """
    s = s.to(torch.float64)
    lo = lo.to(torch.float64).clamp(0.0, 1.0)
    budget = budget.to(torch.float64)
    R, N = s.shape
    if N == 0:
        return s.clone(), torch.where(budget > _TOL, 2, 0).to(torch.int64)
    pos = s > 0
    safe = torch.where(pos, s, torch.ones_like(s))
    # breakpoints: item i enters its linear part at a_i = lo_i / s_i and saturates at b_i = 1 / s_i
    a = torch.where(pos, lo / safe, torch.zeros_like(s))
    b = torch.where(pos, 1.0 / safe, torch.zeros_like(s))
    top = b.amax(dim=1, keepdim=True)
    # items without a linear part (s == 0) get a zero-slope event at the last breakpoint (finite)
    a = torch.where(pos, a, top.expand_as(a))
    b = torch.where(pos, b, top.expand_as(b))
    ds = torch.where(pos, s, torch.zeros_like(s))
    t = torch.cat([a, b], dim=1)  # (R, 2N)
    d = torch.cat([ds, -ds], dim=1)
    t, order = t.sort(dim=1, stable=True)
    d = d.gather(1, order)
    slope = d.cumsum(dim=1).clamp_min(0.0)  # slope of f just after each breakpoint
    f0 = lo.sum(dim=1, keepdim=True)
    gaps = torch.diff(t, dim=1)
    f = torch.cat([f0, f0 + (slope[:, :-1] * gaps).cumsum(dim=1)], dim=1)  # f at each breakpoint
    fmax = f[:, -1]
    k = torch.searchsorted(f.contiguous(), budget[:, None].contiguous(), right=True) - 1
    k = k.clamp(0, 2 * N - 1)
    tk, fk, sk = t.gather(1, k), f.gather(1, k), slope.gather(1, k)
    c = torch.where(sk > 0, tk + (budget[:, None] - fk) / torch.where(sk > 0, sk, 1.0), tk)
    below = budget < f0[:, 0] - _TOL
    above = budget > fmax + _TOL
    c = torch.where(below[:, None], torch.zeros_like(c), c)
    c = torch.where(above[:, None], top, c)
    p = torch.minimum(torch.maximum(c * s, lo), torch.ones_like(s))
    p = torch.where(pos, p, lo)
    status = torch.zeros(R, dtype=torch.int64)
    status[below] = 1
    status[above] = 2
    # second tier: the rest of the budget to the items with a floor but no score
    floor_only = ~pos & (lo > 0)
    spill = above & floor_only.any(dim=1)
    if spill.any():
        rest = budget - pos.sum(dim=1).to(torch.float64)
        p2, status2 = solve_clipped_scale(
            floor_only.to(torch.float64), torch.where(floor_only, lo, 0.0), rest
        )
        p = torch.where(spill[:, None] & floor_only, p2, p)
        status = torch.where(spill, status2, status)
    return p, status


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
    """The completion rule (docs/METHOD.md, "Completion pruning") as a clipped scale: the low set scores
    1, the rest 1 / p_min. absA, zero, valid: (R, N); budget: (R,) -> (p (R, N) float64, status (R,))."""
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
    """Keep probability per completion, expected kept count keep_frac * N exactly when feasible.

    adv: (N,) or (R, N) full-group advantages. p_min: the floor where the gradient may be non-zero.
    allow_zero: p = 0 for A == 0 exactly (only without KL / entropy terms). returns: (p float64 like
    ``adv``, metrics). Raises ValueError for keep_frac or p_min outside (0, 1], or a non-finite A."""
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
    keep_frac * B exactly when feasible. scores: (B,) or (R, B) finite >= 0; unseen: optional bool like
    ``scores`` (a metric only). returns: (q float64 like ``scores``, metrics). Raises ValueError for
    keep_frac or q_min outside (0, 1], or a score that is not finite and >= 0."""
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
