"""Packing that needs OpenRLHF's code: the ``openrlhf`` packer, and DPPO's experience-side forward batches
(``forward_partitions``).

The ``openrlhf`` packer: OpenRLHF 0.11.2's own dynamic-batch partitioning, so that
``--dppo.packer openrlhf`` runs DPPO with the host's packing for comparison. Core declares the name
(``core/packing.py``: valid without this module); ``register()`` fills in the implementation, called by
``adapters.install`` and by the trainer actor, whose process plans the packing. Importing registers
nothing.

OpenRLHF (``NaiveReplayBuffer.setup_dynamic_batch``) takes the micro-batch count from a first-fit pass
under the token budget and then balances the sequences over that many partitions by token sum
(Karmarkar-Karp). A balanced partition may exceed the budget by a little; that is the host's
behaviour and is kept as is. Core's shared distribution step then gives every rank the same number of
micro-batches.
"""

from __future__ import annotations

import numpy as np

from openrlhf_dppo.core import PACKERS, micro_batch_capacity
from openrlhf_dppo.core.packing import distribute, fitting_bins


def register() -> None:
    """Register ``openrlhf_partitions`` as the ``openrlhf`` packer in this process (idempotent)."""
    try:
        PACKERS.get("openrlhf")
    except ValueError:  # declared by core, not registered yet
        PACKERS.register("openrlhf")(openrlhf_partitions)


def openrlhf_partitions(
    lengths: np.ndarray, capacity: int, window: int = 8
) -> tuple[list[list[int]], list[int]]:
    """lengths (n,) -> (bins of sequence indices, bin loads); ``window`` is unused."""
    from openrlhf.utils.seqlen_balancing import (
        get_minimum_num_micro_batch_size,
        get_seqlen_balanced_partitions,
    )

    lens = [int(x) for x in lengths]
    if not lens:
        return [], []
    count = get_minimum_num_micro_batch_size(lens, capacity, 1, 1)
    bins = get_seqlen_balanced_partitions(lens, count, equal_size=False)
    return bins, [sum(lens[i] for i in b) for b in bins]


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
    packing within C (``core.fitting_bins``, first-fit decreasing; a sample longer than C is a bin of its
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
    bins, loads = fitting_bins(lens, capacity, packer="ffd")
    k = min(max(dp, -(-len(bins) // dp) * dp), n // dp * dp)
    parts = [sorted(p) for p in get_seqlen_balanced_partitions([int(x) for x in lens], k, False)]
    if k < len(bins) or all(len(p) == 1 or int(lens[p].sum()) <= capacity for p in parts):
        return parts
    ranks, _, _ = distribute(bins, loads, lens, k)  # k "ranks" of one micro-batch each: the bins split to k
    return [sorted(r[0]) for r in ranks]
