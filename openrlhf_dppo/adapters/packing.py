"""DPPO's experience-side forward batches (``forward_partitions``), which need OpenRLHF's balanced
partitioning (Karmarkar-Karp, ``get_seqlen_balanced_partitions``)."""

from __future__ import annotations

import numpy as np

from openrlhf_dppo.core import fitting_bins, micro_batch_capacity
from openrlhf_dppo.core.packing import distribute


def forward_partitions(lengths: list[int], budget: tuple[int, int, int], dp: int) -> list[list[int]]:
    """Index lists of the experience-side forward batches of ``lengths`` (the kept samples' total
    lengths), for ``dp`` data-parallel ranks under ``budget`` = (``--rollout.max_tokens_per_gpu``,
    ring, TP), whose product C is a batch's token budget.

    The host needs (``split_rollout_samples``' contract, ``RayActorGroup.async_run_method_batch``,
    ``get_seqlen_balanced_partitions``): at least ``dp`` batches, none empty (so at most n, one sample
    each), and a multiple of ``dp`` of them, so that every rank makes the same number of forward calls
    (ZeRO-3 gathers each layer's weights collectively in every forward). OpenRLHF rounds its first-fit
    count DOWN to a multiple of ``dp``, so a batch can hold up to about twice C. Here:

    k = min(max(dp, M rounded UP to a multiple of dp), n rounded DOWN to one), with M the bins of a
    packing within C (``core.fitting_bins``, the window packer; a sample longer than C is a bin of its
    own, as in OpenRLHF): the fewest forward calls the budget allows, never more batches than samples.
    The batches are OpenRLHF's balanced partitions (Karmarkar-Karp) into k when each is within C or a
    single sample; otherwise the M bins split to k (``core.packing.distribute``), which are. Only when
    n rounded down to a multiple of dp is below M (the budget under about twice the lengths and n not a
    multiple of dp) does a batch exceed C: the balanced partition into k, the least it can exceed it by.
    Raises ValueError for fewer samples than ranks.
    """
    from openrlhf.utils.seqlen_balancing import get_seqlen_balanced_partitions

    n = len(lengths)
    if n < dp:
        raise ValueError(f"{n} samples to forward on {dp} data-parallel ranks: each rank needs one")
    capacity = micro_batch_capacity(*budget)
    lens = np.asarray(lengths, dtype=np.int64)
    bins, loads = fitting_bins(lens, capacity)
    k = min(max(dp, -(-len(bins) // dp) * dp), n // dp * dp)
    parts = [sorted(p) for p in get_seqlen_balanced_partitions([int(x) for x in lens], k, False)]
    if k < len(bins) or all(len(p) == 1 or int(lens[p].sum()) <= capacity for p in parts):
        return parts
    ranks, _, _ = distribute(bins, loads, lens, k)  # k "ranks" of one micro-batch each: the bins split to k
    return [sorted(r[0]) for r in ranks]
