"""CPPO's pruning rule (Lin et al. 2025), the biased peer of ``--dppo.method cppo`` (docs/METHOD.md, "The
peers: CPPO and GRESO"): more prompts drawn, the completions of largest |A| of each group kept at weight
1. Counts are cut to integers after a 1e-9 tolerance, so a decimal rate counts what it says.
"""

from __future__ import annotations

import torch

_EPS = 1e-9


def _check_rate(prune_rate: float) -> None:
    if not 0.0 <= prune_rate < 1.0:
        raise ValueError(f"prune_rate {prune_rate!r}: expected a rate in [0, 1)")


def cppo_prompts(batch_size: int, prune_rate: float) -> int:
    """The prompts CPPO draws and rolls out for B = ``batch_size`` at prune rate P in [0, 1):
    int(B / (1 - P)), at least B."""
    _check_rate(prune_rate)
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size!r}: expected at least 1 prompt")
    return max(batch_size, int(batch_size / (1.0 - prune_rate) + _EPS))


def cppo_kept_per_group(group_size: int, prune_rate: float) -> int:
    """Completions CPPO keeps of each group of ``group_size`` (G): G - int(G P), at least 1."""
    _check_rate(prune_rate)
    return max(1, group_size - int(group_size * prune_rate + _EPS))


def cppo_keep_mask(adv: torch.Tensor, prune_rate: float) -> torch.Tensor:
    """adv: (n_groups, G) -> bool mask keeping, per group, the ``cppo_kept_per_group(G, prune_rate)``
    completions of largest |A| (ties: the lower index first). Deterministic."""
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
