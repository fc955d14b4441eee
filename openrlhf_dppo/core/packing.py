"""Dense Prompt Packing (docs/METHOD.md, "Dense Prompt Packing"): micro-batches of at most ``capacity``
tokens (the window packer), the same count on every data-parallel rank (``distribute``). A sequence
longer than ``capacity`` is a micro-batch of its own, as OpenRLHF's dynamic batch trains it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from dataclasses import dataclass

import numpy as np
import torch

from openrlhf_dppo.metric_keys import (
    PACK_DENSITY,
    PACK_EMPTY_MICRO_BATCHES,
    PACK_LOWER_BOUND,
    PACK_MICRO_BATCHES,
    PACK_RANK_IMBALANCE,
    PACK_SEQUENCES,
)

WINDOW = 8  # open bins of the window packer


@dataclass(frozen=True)
class PackPlan:
    """``rank_micro_batches[r][m]`` is the list of sequence indices of micro-batch m of rank r; every
    rank has the same number of micro-batches. ``rank_loads[r]`` is the token count of rank r."""

    rank_micro_batches: list[list[list[int]]]
    rank_loads: list[int]
    capacity: int

    @property
    def micro_batches_per_rank(self) -> int:
        return len(self.rank_micro_batches[0]) if self.rank_micro_batches else 0


def _lengths(lengths) -> np.ndarray:
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(arr == np.floor(arr)):
            raise ValueError("lengths must be integers")
    return arr.astype(np.int64)


def window_best_fit(
    lengths: np.ndarray, capacity: int, window: int = WINDOW, fill_on_close: bool = True
) -> tuple[list[list[int]], list[int]]:
    """lengths (n,) int64, each in [1, capacity] -> (bins as lists of indices, token load per bin).
    ``fill_on_close=False``: the paper's plain window (the benchmark's baseline)."""
    n = lengths.size
    if n == 0:
        return [], []
    order = np.argsort(-lengths, kind="stable")
    ids = order.tolist()
    # one bucket per distinct length, longest first; bucket k holds ids[first[k]:end[k]] (by index)
    neg_vals, first, counts = np.unique(-lengths[order], return_index=True, return_counts=True)
    vals = (-neg_vals).tolist()
    neg = neg_vals.tolist()  # ascending, for bisection
    ptr = first.tolist()
    end = (first + counts).tolist()
    nb = len(vals)
    parent = list(range(nb + 1))  # parent chain -> the next non-empty bucket (nb: none)
    big = n + 1  # open bin key = room * big + bin id: sorted by room, then by bin id
    open_keys: list[int] = []
    bins: list[list[int]] = []
    rooms: list[int] = []

    def next_free(k: int) -> int:
        root = k
        while parent[root] != root:
            root = parent[root]
        while parent[k] != root:  # path compression
            parent[k], k = root, parent[k]
        return root

    def take(k: int) -> int:
        p = ptr[k]
        ptr[k] = p + 1
        if p + 1 == end[k]:
            parent[k] = k + 1
        return ids[p]

    tail = nb - 1  # the last non-empty bucket = the shortest unplaced length

    def close(b: int, room: int) -> None:
        # beyond the paper: fill the room best-fit from the unplaced sequences before the bin leaves
        nonlocal tail
        while fill_on_close and tail >= 0 and vals[tail] <= room:
            k = next_free(bisect_left(neg, -room))
            bins[b].append(take(k))
            room -= vals[k]
            while tail >= 0 and ptr[tail] == end[tail]:
                tail -= 1
        rooms[b] = room

    head = 0
    while True:
        if ptr[head] == end[head]:
            head = next_free(head)
            if head >= nb:
                break
        length = vals[head]
        p = ptr[head]  # take the head sequence (inline: this loop is the hot path)
        ptr[head] = p + 1
        if p + 1 == end[head]:
            parent[head] = head + 1
            while tail >= 0 and ptr[tail] == end[tail]:
                tail -= 1
        j = bisect_left(open_keys, length * big)
        if j < len(open_keys):
            key = open_keys.pop(j)
            b, room = key % big, key // big - length
            bins[b].append(ids[p])
            rooms[b] = room
        else:
            if len(open_keys) >= window:
                key = open_keys.pop(0)  # none fits: close the fullest open bin
                close(key % big, key // big)
            b, room = len(bins), capacity - length
            bins.append([ids[p]])
            rooms.append(room)
        shortest = vals[tail] if tail >= 0 else capacity + 1
        if room >= shortest:
            insort(open_keys, room * big + b)
        while open_keys and open_keys[0] // big < shortest:  # nothing can enter these any more
            open_keys.pop(0)
    for key in open_keys:
        rooms[key % big] = key // big
    return bins, [capacity - r for r in rooms]


def _split(bin_: list[int], lens: np.ndarray) -> tuple[list[int], list[int], int, int]:
    """Split a bin into two halves balanced by tokens (longest first into the lighter half)."""
    halves: tuple[list[int], list[int]] = ([], [])
    loads = [0, 0]
    for i in sorted(bin_, key=lambda i: (-int(lens[i]), i)):
        h = 0 if loads[0] <= loads[1] else 1
        halves[h].append(i)
        loads[h] += int(lens[i])
    return halves[0], halves[1], loads[0], loads[1]


def distribute(
    bins: list[list[int]], loads: list[int], lengths: np.ndarray, dp_size: int
) -> tuple[list[list[list[int]]], list[int], int]:
    """Bins -> (rank_micro_batches with equal counts per rank, rank loads, empty micro-batches added)."""
    bins, loads = list(bins), list(loads)
    k = -(-len(bins) // dp_size)
    need = k * dp_size - len(bins)
    if need:
        heap = [(-load, j) for j, load in enumerate(loads) if len(bins[j]) >= 2]
        heapq.heapify(heap)
        while need > 0 and heap:
            _, j = heapq.heappop(heap)
            first, second, l1, l2 = _split(bins[j], lengths)
            bins[j], loads[j] = first, l1
            bins.append(second)
            loads.append(l2)
            for jj in (j, len(bins) - 1):
                if len(bins[jj]) >= 2:
                    heapq.heappush(heap, (-loads[jj], jj))
            need -= 1
    empty = need
    bins.extend([] for _ in range(empty))
    loads.extend(0 for _ in range(empty))
    ranks: list[list[list[int]]] = [[] for _ in range(dp_size)]
    rank_loads = [0] * dp_size
    rank_heap = [(0, r) for r in range(dp_size)]
    for j in np.lexsort((np.arange(len(loads)), -np.asarray(loads, dtype=np.int64))).tolist():
        load, r = heapq.heappop(rank_heap)
        ranks[r].append(bins[j])
        rank_loads[r] = load + loads[j]
        if len(ranks[r]) < k:
            heapq.heappush(rank_heap, (rank_loads[r], r))
    return ranks, rank_loads, empty


def fitting_bins(lengths: np.ndarray, capacity: int) -> tuple[list[list[int]], list[int]]:
    """lengths (n,) int64 >= 1 -> (bins, loads): every sequence longer than ``capacity`` alone in a bin
    (in index order), then the window packer's bins of the others (indices into ``lengths``)."""
    over = np.flatnonzero(lengths > capacity)
    rest = np.flatnonzero(lengths <= capacity)
    bins: list[list[int]] = [[int(i)] for i in over]
    loads = [int(lengths[i]) for i in over]
    if rest.size:
        packed, packed_loads = window_best_fit(lengths[rest], capacity)
        bins += [[int(rest[j]) for j in b] for b in packed]
        loads += list(packed_loads)
    return bins, loads


def pack(lengths, capacity: int, dp_size: int = 1) -> tuple[PackPlan, dict]:
    """Pack sequences into micro-batches of at most ``capacity`` tokens, equal count per rank.

    lengths: (n,) ints (list, numpy or torch), the full length (prompt + response) of each sequence.
    capacity: tokens per micro-batch (per GPU).  dp_size: data-parallel ranks.
    returns: (PackPlan, metrics). Raises ValueError for a length < 1, capacity < 1 or dp_size < 1.
    """
    if capacity < 1 or dp_size < 1:
        raise ValueError(f"capacity and dp_size must be >= 1 (got {capacity}, {dp_size})")
    lens = _lengths(lengths)
    if lens.size and lens.min() < 1:
        i = int(np.argmin(lens))
        raise ValueError(f"sequence {i} has length {int(lens[i])}; every sequence needs >= 1 token")
    bins, loads = fitting_bins(lens, int(capacity))
    ranks, rank_loads, empty = distribute(bins, loads, lens, int(dp_size))
    plan = PackPlan(rank_micro_batches=ranks, rank_loads=rank_loads, capacity=int(capacity))
    return plan, pack_metrics(lens, plan, dp_size, empty)


def pack_metrics(lengths: np.ndarray, plan: PackPlan, dp_size: int, empty: int = 0) -> dict:
    total = int(lengths.sum())
    k = plan.micro_batches_per_rank
    cap = plan.capacity
    over = lengths > cap
    n_big = int((lengths * 2 > cap).sum())
    lower = -(-max(int(over.sum()) - (-int(lengths[~over].sum()) // cap), n_big) // dp_size)
    # a micro-batch's slot: the capacity, or the length of the longer sequence it holds alone
    slots = k * dp_size * cap + int((lengths[over] - cap).sum())
    mean_load = total / dp_size
    return {
        PACK_DENSITY: total / slots if k else 0.0,
        PACK_MICRO_BATCHES: float(k),
        PACK_LOWER_BOUND: float(lower),
        PACK_RANK_IMBALANCE: max(plan.rank_loads) / mean_load if total else 1.0,
        PACK_EMPTY_MICRO_BATCHES: float(empty),
        PACK_SEQUENCES: float(lengths.size),
    }


def micro_batch_capacity(max_tokens_per_gpu: int, ring_attn_size: int, tensor_parallel_size: int) -> int:
    """Tokens one packed training micro-batch holds: the per-GPU budget times the GPUs that share a
    sequence (ring attention, tensor parallel), as OpenRLHF's dynamic batch counts."""
    return max_tokens_per_gpu * ring_attn_size * tensor_parallel_size
