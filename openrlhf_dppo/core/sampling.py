"""The draws (docs/METHOD.md, "Systematic sampling"): a keep mask with given inclusion probabilities
(``sample_mask``; weights MUST be 1 / p_used), and one call per pruning level for the adapters. All
randomness comes from the ``torch.Generator`` passed in.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from openrlhf_dppo.core.estimator import inverse_prob_weights, keep_metrics, weight_metrics
from openrlhf_dppo.core.keep_probs import completion_keep_probs, prompt_keep_probs, solve_clipped_scale
from openrlhf_dppo.metric_keys import (
    COMPLETION_FIXED_SIZE_FALLBACK,
    COMPLETION_FIXED_SIZE_NOT_MULTIPLE,
    COMPLETION_KEEP_FRAC_EXPECTED,
    PROMPT_KEEP_FRAC_EXPECTED,
)

_EPS = 1e-9


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator seeded from (seed, step, stream) through numpy's SeedSequence: independent,
    reproducible streams per level (0 prompts, 1 completions) and step; a resume repeats them."""
    state = np.random.SeedSequence([int(seed), int(step), int(stream)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _systematic(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """p: (R, N) -> mask (R, N) bool; randomly ordered systematic sampling, one start per row."""
    R, N = p.shape
    certain = p >= 1.0
    rest = torch.where(certain, 0.0, p)
    perm = torch.rand(R, N, generator=generator, dtype=torch.float64).argsort(dim=1)
    u = torch.rand(R, 1, generator=generator, dtype=torch.float64)
    cs = rest.gather(1, perm).cumsum(dim=1)
    if N:  # snap an integer total that rounding moved off its integer (keeps the count exact)
        total = cs[:, -1:]
        near = (total - total.round()).abs() < 1e-6
        cs = torch.where(near & (total > 0), cs * (total.round() / total.clamp_min(_EPS)), cs)
    hits = torch.ceil(cs - u).clamp_min(0)  # number of points u + k below each cumulative sum
    prev = torch.cat([torch.zeros(R, 1, dtype=hits.dtype), hits[:, :-1]], dim=1)
    picked = torch.zeros(R, N, dtype=torch.bool)
    picked.scatter_(1, perm, hits > prev)
    return picked | certain


def _nearest_multiple(total, low, high, m: float):
    """The multiple of m nearest to ``total`` within [low, high] (rows), and whether one exists."""
    target = torch.round(total / m) * m
    target = torch.where(target < low, torch.ceil(low / m) * m, target)
    target = torch.where(target > high, torch.floor(high / m) * m, target)
    return target, (target >= low) & (target <= high)


def _row_floor(P: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(R, N): the smallest probability among ``items`` of each row, on those items; 0 elsewhere."""
    floor = torch.where(items, P, 2.0).amin(dim=1, keepdim=True) if P.shape[1] else P[:, :1]
    return torch.where(items, floor.clamp_max(1.0), 0.0)


FIXED_SIZE_HELD, FIXED_SIZE_FALLBACK, FIXED_SIZE_NOT_MULTIPLE = 0, 1, 2


def fixed_size_probs(p: torch.Tensor, multiple_of: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rescale inclusion probabilities so that each row sums to a multiple of ``multiple_of``.
    p: (N,) or (R, N) in [0, 1].  returns: (p_used like p, float64; status (R,) int64):
      0 (``FIXED_SIZE_HELD``) a multiple reached with the p = 1 items held at 1;
      1 (``FIXED_SIZE_FALLBACK``) reachable only by scaling the p = 1 items down too;
      2 (``FIXED_SIZE_NOT_MULTIPLE``) no multiple reachable: the nearest reachable integer, p = 1 held.
    """
    if multiple_of < 1:
        raise ValueError(f"multiple_of must be >= 1, got {multiple_of}")
    P = (p[None] if p.dim() == 1 else p).to(torch.float64)
    m = float(multiple_of)
    pos = P > 0
    certain = P >= 1.0
    free = pos & ~certain
    n_certain = certain.sum(dim=1).to(torch.float64)
    total = P.sum(dim=1)

    lo_free = _row_floor(P, free)
    low = n_certain + torch.ceil(lo_free.sum(dim=1) - _EPS)
    high = n_certain + free.sum(dim=1).to(torch.float64)
    held_target, held_ok = _nearest_multiple(total, low, high, m)
    integer = torch.minimum(torch.maximum(torch.round(total), low), high)
    held_target = torch.where(held_ok, held_target, integer)
    q_held, _ = solve_clipped_scale(torch.where(free, P, 0.0), lo_free, held_target - n_certain)
    q_held = torch.where(certain, 1.0, torch.where(free, q_held, 0.0))
    q_held = torch.where(((total - held_target).abs() < _EPS)[:, None], P, q_held)  # already there

    lo_all = _row_floor(P, pos)
    all_target, all_ok = _nearest_multiple(
        total, torch.ceil(lo_all.sum(dim=1) - _EPS), pos.sum(dim=1).double(), m
    )
    q_all, _ = solve_clipped_scale(torch.where(pos, P, 0.0), lo_all, all_target)
    q_all = torch.where(pos, q_all, 0.0)

    fallback = ~held_ok & all_ok
    status = torch.where(
        held_ok, FIXED_SIZE_HELD, torch.where(fallback, FIXED_SIZE_FALLBACK, FIXED_SIZE_NOT_MULTIPLE)
    )
    q = torch.where(fallback[:, None], q_all, q_held)
    return q.reshape(p.shape), status.to(torch.int64)


def sample_mask(
    p: torch.Tensor, generator: torch.Generator, multiple_of: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Systematic sampling of p: (N,) or (R, N) in [0, 1] (rows independent), the kept count made a
    multiple of ``multiple_of`` (``fixed_size_probs``). returns: (mask bool, p_used float64), like p:
    weight kept items by 1 / p_used."""
    if p.dim() not in (1, 2):
        raise ValueError(f"p must have shape (N,) or (R, N), got {tuple(p.shape)}")
    P = p.to(torch.float64)
    if torch.isnan(P).any() or (P < 0).any() or (P > 1).any():
        raise ValueError("inclusion probabilities must lie in [0, 1]")
    P, _ = fixed_size_probs(P, multiple_of)
    mask = _systematic(P[None] if P.dim() == 1 else P, generator)
    return mask.reshape(p.shape), P


class Draw(NamedTuple):
    """mask: (N,) bool; prob: (N,) float64 used (after any rescale); weight: (N,) float64, 1 / prob
    on kept items (times the prompt weight where given), 0 elsewhere."""

    mask: torch.Tensor
    prob: torch.Tensor
    weight: torch.Tensor


def prune_prompts(
    scores: torch.Tensor,
    keep_frac: float,
    q_min: float,
    generator: torch.Generator,
    policy: str = "proportional",
    unseen: torch.Tensor | None = None,
) -> tuple[Draw, dict]:
    """scores: (B,) (``PromptHistory.signals``); policy: a name in ``PROMPT_POLICIES``; unseen:
    optional (B,) bool (a metric only). returns (Draw over the B prompts, metrics); never empty."""
    q, m = prompt_keep_probs(scores, keep_frac, q_min, policy, unseen=unseen)
    mask, q_used = sample_mask(q, generator)
    m[PROMPT_KEEP_FRAC_EXPECTED] = float(q_used.sum() / max(q_used.numel(), 1))
    return Draw(mask, q_used, inverse_prob_weights(q_used, mask)), {**m, **keep_metrics(prompt_mask=mask)}


def prune_completions(
    adv: torch.Tensor,
    keep_frac: float,
    p_min: float,
    allow_zero: bool,
    generator: torch.Generator,
    multiple_of: int = 1,
    prompt_weight: torch.Tensor | None = None,
) -> tuple[Draw, dict]:
    """adv: (N,) full-group advantages; prompt_weight: optional (N,) 1 / q_j of each completion's
    prompt, folded into ``Draw.weight``. returns (Draw over the N completions, metrics)."""
    p, m = completion_keep_probs(adv, keep_frac, p_min, allow_zero)
    p, status = fixed_size_probs(p, multiple_of)  # sample_mask's own rescale leaves it unchanged
    m[COMPLETION_FIXED_SIZE_FALLBACK] = float((status == FIXED_SIZE_FALLBACK).double().mean())
    m[COMPLETION_FIXED_SIZE_NOT_MULTIPLE] = float((status == FIXED_SIZE_NOT_MULTIPLE).double().mean())
    mask, p_used = sample_mask(p, generator)
    m[COMPLETION_KEEP_FRAC_EXPECTED] = float(p_used.sum() / max(p_used.numel(), 1))
    w = inverse_prob_weights(p_used, mask)
    if prompt_weight is not None:
        if prompt_weight.shape != w.shape:
            raise ValueError(f"prompt_weight {tuple(prompt_weight.shape)} must match adv {tuple(adv.shape)}")
        w = w * prompt_weight.to(torch.float64)
    metrics = {**m, **keep_metrics(completion_mask=mask), **weight_metrics(w[mask])}
    return Draw(mask, p_used, w), metrics
