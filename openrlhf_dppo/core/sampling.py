"""Sampling designs: draw a keep mask with given inclusion probabilities (METHOD.md, "The unbiased
estimator" and the remark on fixed-size designs).

Registered in ``SAMPLING_DESIGNS``:
- ``bernoulli``: independent draws, item i kept with probability p_i; the kept count is random.
- ``systematic``: a fixed-size design with the same inclusion probabilities. The items are put in a
  random order (a fresh permutation per draw, so no pair of items is tied to the input order), the
  cumulative sums S_k of p are laid on a line, and the points u, u + 1, u + 2, ... with u ~ U[0, 1)
  select the items whose interval [S_{k-1}, S_k) they hit. Item i is kept with probability exactly p_i
  and the kept count is exactly sum(p) when that sum is an integer. Items with p = 1 are always kept,
  items with p = 0 never.

Fixed kept count: before a fixed-size draw, ``fixed_size_probs`` moves sum(p) to the multiple of
``multiple_of`` nearest to it (``multiple_of=1``: the nearest integer) that can be reached while the
items with p = 1 STAY at 1 (unseen prompts, uniform-low's high-|A| completions): only the other
positive items are rescaled, q_i = clip(c * p_i, lo, 1) (exact solve, see
``clipped_scale.solve_clipped_scale``), with the floor lo their smallest probability, so floors survive
the rescale; p = 0 stays 0. Only when no multiple is reachable that way are the p = 1 items scaled too
(every positive item, same floor: the fallback, status 1); when no multiple is reachable at all, the
nearest reachable integer is used with the p = 1 items held (status 2: the count is exact but not a
multiple). A row whose sum already is such a multiple is returned unchanged. ``sample_mask`` returns
the probabilities it actually used: the weights MUST be 1 / p_used, otherwise the estimator is biased.

Bernoulli cannot guarantee a count, so ``multiple_of > 1`` with a non-fixed-size design is refused.

Never empty (``nonempty=True``, the prompt level): OpenRLHF's loop answers a step without rollouts by
asking for the next prompt batch, so a Bernoulli draw that keeps nothing would make the step's estimate
conditional on a non-empty draw, E = g / P(non-empty). Instead a row that keeps nothing is drawn again
(rejective sampling): the kept set is then distributed as the Bernoulli set given that it is not
empty, and as item i is never kept in an empty set, its inclusion probability is exactly
pi_i = p_i / P(non-empty), P(non-empty) = 1 - prod_k (1 - p_k). ``p_used`` is that pi, so 1 / p_used
stays the Horvitz-Thompson weight and the estimator stays unbiased with no empty step possible. A
fixed-size design needs no redraw: its count is at least 1 whenever sum(p) > 0 (``fixed_size_probs``).
Draws are reproducible: all randomness comes from the ``torch.Generator`` passed in
(``step_generator`` derives one per (seed, step, stream)).
"""

from __future__ import annotations

import numpy as np
import torch

from openrlhf_dppo.core.clipped_scale import solve_clipped_scale
from openrlhf_dppo.core.registry import Registry

SAMPLING_DESIGNS = Registry("sampling design")
#: designs whose kept count is fixed by sum(p) (so it can be made a multiple of the DP size)
FIXED_SIZE_DESIGNS: set[str] = set()

_EPS = 1e-9


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator seeded from (seed, step, stream) through numpy's SeedSequence, so that the
    prompt level (stream 0) and the completion level (stream 1) of every step draw independent,
    reproducible numbers, and a resumed run repeats the draws of the run it resumes."""
    state = np.random.SeedSequence([int(seed), int(step), int(stream)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@SAMPLING_DESIGNS.register(
    "bernoulli", help="independent draws; a prompt draw that keeps nothing is drawn again, weighted exactly"
)
def _bernoulli(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """p: (R, N) -> mask (R, N) bool, independent draws."""
    return torch.rand(p.shape, generator=generator, dtype=torch.float64) < p


def _nonempty_rows(p: torch.Tensor, mask: torch.Tensor, fn, generator: torch.Generator):
    """Redraw every row of ``mask`` that kept nothing (each redraw uses ``fn`` on the whole row);
    returns (mask, p / P(row non-empty)). p: (R, N) float64 with a positive entry in every row."""
    if (p.sum(dim=1) <= 0).any():
        raise ValueError("a row with every probability 0 can never keep an item (nonempty=True)")
    empty = ~mask.any(dim=1)
    while empty.any():
        mask[empty] = fn(p[empty], generator)
        empty = ~mask.any(dim=1)
    p_nonempty = -torch.expm1(torch.log1p(-p.clamp_max(1.0)).sum(dim=1, keepdim=True))
    return mask, (p / p_nonempty).clamp_max(1.0)


@SAMPLING_DESIGNS.register(
    "systematic", help="fixed kept count; the completion count is a multiple of the data-parallel size"
)
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


FIXED_SIZE_DESIGNS.add("systematic")


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
    p: torch.Tensor, design: str, generator: torch.Generator, multiple_of: int = 1, nonempty: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw a keep mask.

    p: (N,) or (R, N) inclusion probabilities in [0, 1] (rows independent).
    design: a name in ``SAMPLING_DESIGNS``.  generator: the only source of randomness.
    multiple_of: for a fixed-size design the kept count is made a multiple of it (1: an integer);
      must be 1 for ``bernoulli``.
    nonempty: every row keeps at least one item (see "Never empty" above); p_used is then the
      inclusion probability given that, p / P(row non-empty).
    returns: (mask bool like p, p_used float64 like p) -- weight kept items by 1 / p_used.
    """
    fn = SAMPLING_DESIGNS.get(design)
    if p.dim() not in (1, 2):
        raise ValueError(f"p must have shape (N,) or (R, N), got {tuple(p.shape)}")
    P = p.to(torch.float64)
    if torch.isnan(P).any() or (P < 0).any() or (P > 1).any():
        raise ValueError("inclusion probabilities must lie in [0, 1]")
    if design in FIXED_SIZE_DESIGNS:
        P, _ = fixed_size_probs(P, multiple_of)
    elif multiple_of != 1:
        raise ValueError(
            f"multiple_of={multiple_of} needs a fixed-size design ({', '.join(sorted(FIXED_SIZE_DESIGNS))}); "
            f"{design!r} has a random kept count"
        )
    rows = P[None] if P.dim() == 1 else P
    mask = fn(rows, generator)
    if nonempty and design not in FIXED_SIZE_DESIGNS and rows.shape[1]:
        if design != "bernoulli":  # pi = p / P(non-empty) holds for independent draws only
            raise ValueError(f"nonempty=True is defined for bernoulli and fixed-size designs, not {design!r}")
        mask, rows = _nonempty_rows(rows, mask, fn, generator)
        P = rows.reshape(P.shape)
    return mask.reshape(p.shape), P
