"""CPPO's pruning rule (Lin et al. 2025, "CPPO: Accelerating the Training of Group Relative Policy
Optimization-Based Reasoning Models"), the biased peer of ``--dppo.method cppo`` (docs/METHOD.md, "The
peers: CPPO and GRESO").

CPPO draws more prompts than GRPO, rolls every one out, and trains only the completions of each group
with the largest |A|, at weight 1, with the advantages of the full group: the update has GRPO's size,
but its expectation is not GRPO's gradient (no reweighting; biased by design, as published). Pure torch.

Both counts are taken with a tolerance of 1e-9 before the integer cut, so that a rate written in decimal
counts what it says (3 / (1 - 0.7) is 9.999999999999998 in floating point, 0.57 x 100 is
56.99999999999999).
"""

from __future__ import annotations

import torch

_EPS = 1e-9


def _check_rate(prune_rate: float) -> None:
    if not 0.0 <= prune_rate < 1.0:
        raise ValueError(f"prune_rate {prune_rate!r}: expected a rate in [0, 1)")


def cppo_prompts(batch_size: int, prune_rate: float) -> int:
    """The prompts CPPO draws and rolls out for a rollout batch of ``batch_size`` (B) prompts at completion
    prune rate ``prune_rate`` (P in [0, 1)): int(B / (1 - P)), at least B; so that the completions kept,
    about G (1 - P) of each group, add up to GRPO's B G."""
    _check_rate(prune_rate)
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size!r}: expected at least 1 prompt")
    return max(batch_size, int(batch_size / (1.0 - prune_rate) + _EPS))


def cppo_kept_per_group(group_size: int, prune_rate: float) -> int:
    """Completions CPPO keeps of each group of ``group_size`` (G): G - int(G P), at least 1."""
    _check_rate(prune_rate)
    return max(1, group_size - int(group_size * prune_rate + _EPS))


def cppo_keep_mask(adv: torch.Tensor, prune_rate: float) -> torch.Tensor:
    """adv: the full groups' advantages, shape (n_groups, G). Returns a bool mask of the same shape that
    keeps, in every group, the ``cppo_kept_per_group(G, prune_rate)`` completions of largest |A|; among
    equal |A| the lower index is kept first (a stable order). Deterministic: no draw, no weights (every
    kept completion trains at weight 1)."""
    if adv.dim() != 2:
        raise ValueError(f"adv of shape {tuple(adv.shape)}: expected (n_groups, G)")
    n_groups, G = adv.shape
    mask = torch.zeros(n_groups, G, dtype=torch.bool, device=adv.device)
    if n_groups == 0 or G == 0:
        return mask
    k = cppo_kept_per_group(G, prune_rate)
    order = torch.sort(adv.abs(), dim=1, descending=True, stable=True).indices
    mask.scatter_(1, order[:, :k], True)
    return mask
