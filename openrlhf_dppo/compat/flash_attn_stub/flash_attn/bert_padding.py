"""Padding helpers with the contracts OpenRLHF relies on, written in plain torch.

Shapes: ``b`` batch, ``s`` padded length, ``nnz`` number of real (unmasked) tokens.
"""

from __future__ import annotations

import torch
from einops import rearrange  # re-exported: OpenRLHF imports it from here

__all__ = ["index_first_axis", "index_put_first_axis", "pad_input", "rearrange", "unpad_input"]


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``x[indices]`` of ``x`` (shape (n, ...)) -> (len(indices), ...), differentiable."""
    return x[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """Inverse of ``index_first_axis``: zeros of shape (first_axis_dim, ...) with ``values`` at ``indices``."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_put((indices,), values)


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
):
    """Drop padding: (b, s, ...) with mask (b, s) -> (nnz, ...).

    Returns ``(unpadded, indices, cu_seqlens, max_seqlen_in_batch, seqused)`` where ``indices`` are the
    flat positions (in b*s) of the kept tokens, ``cu_seqlens`` (b+1,) int32 cumulative lengths starting at
    0, ``max_seqlen_in_batch`` an int and ``seqused`` (b,) int32 the tokens used per row. With
    ``unused_mask`` (tokens allocated but not attended), kept = attention_mask | unused_mask while
    ``seqused`` counts only ``attention_mask``.
    """
    keep = attention_mask.bool() if unused_mask is None else (attention_mask.bool() | unused_mask.bool())
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = torch.zeros(seqlens.numel() + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = torch.cumsum(seqlens, dim=0)
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Put (nnz, ...) rows back at ``indices`` of a zero (batch, seqlen, ...) tensor."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
