"""``all_gather`` along the first dimension with a gradient, as OpenRLHF's ring-attention code uses it."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_gather"]


class _AllGatherFirstDim(torch.autograd.Function):
    """Forward: concatenate every rank's (n, ...) tensor -> (world*n, ...); backward: this rank's slice of
    the summed upstream gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group):
        ctx.group = group
        world = dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group = ctx.group
        world = dist.get_world_size(group)
        grad = grad.contiguous()
        dist.all_reduce(grad, group=group)
        rank = dist.get_rank(group)
        return grad.chunk(world, dim=0)[rank].contiguous(), None


def all_gather(x: torch.Tensor, process_group=None) -> torch.Tensor:
    """Gather ``x`` (n, ...) from all ranks of ``process_group`` -> (world*n, ...), differentiable."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(process_group) == 1:
        return x
    return _AllGatherFirstDim.apply(x, process_group)
