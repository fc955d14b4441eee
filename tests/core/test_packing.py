"""Packer: a hand-derived case, properties (hypothesis), a reference loop vs the fast window packer over
seeds, an over-long sequence in a micro-batch of its own, and the packing targets on long-tailed lengths."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openrlhf_dppo.core import pack
from openrlhf_dppo.core.packing import WINDOW, window_best_fit


def test_window_hand():
    # lengths [6, 5, 4, 3, 2], C = 10, W = 1. Longest first: 6 opens bin0 (room 4). 5 fits nowhere and
    # the window is full: bin0 closes and is filled best-fit from the unplaced (4 -> room 0); 5 opens
    # bin1 (room 5); 3 fits bin1 (room 2); 2 fits bin1 (room 0). Bins: [6, 4], [5, 3, 2].
    bins, loads = window_best_fit(np.array([6, 5, 4, 3, 2]), 10, 1)
    assert bins == [[0, 2], [1, 3, 4]] and loads == [10, 10]
    # the paper's plain window (no fill on close): bin0 [6] closes with room 4; 5 opens bin1, 4 joins
    # it (room 1 < shortest 2: closed); 3 opens bin2, 2 joins it. Three bins instead of two.
    bins, loads = window_best_fit(np.array([6, 5, 4, 3, 2]), 10, 1, fill_on_close=False)
    assert bins == [[0], [1, 2], [3, 4]] and loads == [6, 9, 5]
    plan, m = pack([6, 5, 4, 3, 2], 10, dp_size=2)  # W = 8 gives the same two bins here
    assert WINDOW == 8
    assert sorted(map(sorted, (mb for r in plan.rank_micro_batches for mb in r))) == [[0, 2], [1, 3, 4]]
    assert m["dppo/pack_density"] == 1.0 and m["dppo/pack_micro_batches"] == 1.0
    assert m["dppo/pack_lower_bound"] == 1.0 and m["dppo/pack_rank_imbalance"] == 1.0


def test_uneven_bin_count_is_split_not_padded():
    # 3 bins over dp 2: k = 2 per rank, the heaviest splittable bin is split into two halves
    plan, m = pack([6, 4, 5, 3, 2], 10, dp_size=2)
    assert m["dppo/pack_micro_batches"] == 1.0  # 2 bins, fine
    plan, m = pack([9, 9, 9, 1], 10, dp_size=2)
    # bins [9, 1], [9], [9] -> 3 bins, 4 needed: [9, 1] splits into [9] and [1]
    assert plan.micro_batches_per_rank == 2 and m["dppo/pack_empty_micro_batches"] == 0.0
    assert sorted(len(mb) for r in plan.rank_micro_batches for mb in r) == [1, 1, 1, 1]
    # fewer sequences than micro-batch slots: empty micro-batches are unavoidable and reported
    plan, m = pack([5, 5, 5], 10, dp_size=4)
    assert plan.micro_batches_per_rank == 1 and m["dppo/pack_empty_micro_batches"] == 1.0


def test_a_sequence_longer_than_the_capacity_is_a_micro_batch_of_its_own():
    # [3, 4, 20, 1] at capacity 16 on 2 ranks: 20 alone (as OpenRLHF's first fit puts it), the others
    # (8 tokens) in one bin; one micro-batch a rank. Slots: 16 + 20 (the long one's own length), so the
    # density is 28 / 36; the lower bound is 1 + ceil(8 / 16) = 2 bins, 1 a rank.
    plan, m = pack([3, 4, 20, 1], 16, 2)
    assert sorted(sorted(mb) for r in plan.rank_micro_batches for mb in r) == [[0, 1, 3], [2]]
    assert m["dppo/pack_density"] == pytest.approx(28 / 36) and m["dppo/pack_lower_bound"] == 1.0
    # two long ones on one rank: never together, never with another sequence
    plan, m = pack([17, 30, 2, 3], 16, 1)
    assert sorted(sorted(mb) for mb in plan.rank_micro_batches[0]) == [[0], [1], [2, 3]]
    assert m["dppo/pack_lower_bound"] == 3.0 and m["dppo/pack_micro_batches"] == 3.0


def test_errors_and_empty():
    with pytest.raises(ValueError, match=">= 1 token"):
        pack([3, 0], 16, 2)
    with pytest.raises(ValueError, match="capacity and dp_size must be >= 1"):
        pack([3], 16, 0)
    plan, m = pack([], 16, 4)
    assert plan.rank_micro_batches == [[], [], [], []] and m["dppo/pack_density"] == 0.0


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=0, max_size=120),
    capacity=st.integers(48, 200),  # below 64: some sequences longer than the capacity
    dp=st.integers(1, 8),
)
def test_pack_properties(lengths, capacity, dp):
    plan, m = pack(lengths, capacity, dp)
    flat = [i for r in plan.rank_micro_batches for mb in r for i in mb]
    assert sorted(flat) == list(range(len(lengths)))  # every sequence exactly once
    k = plan.micro_batches_per_rank
    assert all(len(r) == k for r in plan.rank_micro_batches) and len(plan.rank_micro_batches) == dp
    loads = [[sum(lengths[i] for i in mb) for mb in rank] for rank in plan.rank_micro_batches]
    assert all(load <= capacity or len(mb) == 1 for r, rl in zip(plan.rank_micro_batches, loads)
               for mb, load in zip(r, rl))  # fmt: skip
    assert plan.rank_loads == [sum(r) for r in loads]
    assert k >= m["dppo/pack_lower_bound"]
    empty = sum(1 for r in plan.rank_micro_batches for mb in r if not mb)
    assert empty == m["dppo/pack_empty_micro_batches"]
    assert empty == 0 or len(lengths) < k * dp  # empties only where unavoidable
    plan2, m2 = pack(lengths, capacity, dp)
    assert plan2 == plan and m2 == m  # deterministic


def _window_reference(lengths, capacity, window):
    # the documented algorithm written plainly: O(n * (W + n)) lists, no buckets, no bisection on keys
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    placed = [False] * len(order)
    bins, rooms, open_ = [], [], []  # open_: bin ids

    def unplaced():
        return [p for p in range(len(order)) if not placed[p]]

    def close(b):
        while True:
            cands = [p for p in unplaced() if lengths[order[p]] <= rooms[b]]
            if not cands:
                return
            p = cands[0]  # the longest that fits, first position among equals
            placed[p] = True
            bins[b].append(order[p])
            rooms[b] -= lengths[order[p]]

    for p in range(len(order)):
        if placed[p]:
            continue
        placed[p] = True
        length = lengths[order[p]]
        fits = [b for b in open_ if rooms[b] >= length]
        if fits:
            b = min(fits, key=lambda b: (rooms[b], b))
            open_.remove(b)
            bins[b].append(order[p])
            rooms[b] -= length
        else:
            if len(open_) >= window:
                b_close = min(open_, key=lambda b: (rooms[b], b))
                open_.remove(b_close)
                close(b_close)
            b = len(bins)
            bins.append([order[p]])
            rooms.append(capacity - length)
        rest = unplaced()
        shortest = lengths[order[rest[-1]]] if rest else capacity + 1
        if rooms[b] >= shortest:
            open_.append(b)
        open_ = [o for o in open_ if rooms[o] >= shortest]
    return bins


@pytest.mark.parametrize("seed", range(12))
def test_fast_window_packer_matches_the_reference_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 150))
    lengths = np.clip(rng.lognormal(3.5, 0.9, n).astype(int) + 1, 1, 200)
    window = int(rng.integers(1, 6))
    assert window_best_fit(lengths, 200, window)[0] == _window_reference(lengths.tolist(), 200, window)


@pytest.mark.parametrize("prune", [0.0, 0.5])
def test_targets_on_long_tailed_lengths(prune):
    # issue targets: density >= 0.97, <= lower bound + 1 micro-batches per rank, imbalance <= 1.05
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(np.log(2000), 0.8, 10_000).astype(int) + 200, 1, 16_384)
    if prune:
        lengths = lengths[rng.random(lengths.size) >= prune]
    _, m = pack(lengths, 16_384, dp_size=8)
    assert m["dppo/pack_density"] >= 0.97
    assert m["dppo/pack_micro_batches"] <= m["dppo/pack_lower_bound"] + 1
    assert m["dppo/pack_rank_imbalance"] <= 1.05
