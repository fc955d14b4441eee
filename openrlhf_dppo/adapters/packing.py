"""The ``openrlhf`` packer: OpenRLHF 0.11.2's own dynamic-batch partitioning, so that
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

from openrlhf_dppo.core import PACKERS


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
