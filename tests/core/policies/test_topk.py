"""``topk``: hand-derived cases and a plain loop reference over seeds (the generic budget, floor,
monotonicity and unbiasedness tests loop over every registered policy, this one included)."""

import pytest
import torch

from openrlhf_dppo.core import completion_keep_probs

A8 = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 0.1], dtype=torch.float64)


def test_topk_hand():
    # |A| = [5, 4, 3, 2], p_min 0.1, keep 0.6 -> K = 2.4: k = (2.4 - 4 * 0.1) / 0.9 = 20/9; the two
    # largest at 1, the third shares (20/9 - 2) + (3 - 20/9) * 0.1 = 2.7/9 = 0.3, the last at 0.1
    p, m = completion_keep_probs(torch.tensor([5.0, -4.0, 3.0, 2.0]), 0.6, "topk", 0.1)
    torch.testing.assert_close(p, torch.tensor([1.0, 1.0, 0.3, 0.1], dtype=torch.float64), rtol=0, atol=1e-12)
    assert m["dppo/completion_keep_frac_expected"] == pytest.approx(0.6, abs=1e-12)
    # an integer k: keep 0.55 -> K = 2.2, k = 2 exactly -> [1, 1, 0.1, 0.1]
    p, _ = completion_keep_probs(torch.tensor([5.0, -4.0, 3.0, 2.0]), 0.55, "topk", 0.1)
    torch.testing.assert_close(p, torch.tensor([1.0, 1.0, 0.1, 0.1], dtype=torch.float64), rtol=0, atol=1e-12)


def test_topk_ties_at_the_boundary_share():
    # A8: |A| sorted 2, 1, 1, 0.5, 0.5, 0.1, 0, 0; keep 0.5 -> K = 4, k = (4 - 0.8) / 0.9 = 32/9.
    # 2, 1, 1 are sure (a = 3); the two 0.5 tie at position floor(k) = 3 and share
    # ((32/9 - 3) + (5 - 32/9) * 0.1) / 2 = 0.35; the rest sit at 0.1: 3 + 0.7 + 0.3 = 4
    p, m = completion_keep_probs(A8, 0.5, "topk", 0.1)
    want = torch.tensor([0.1, 0.1, 1, 1, 0.35, 0.35, 1, 0.1], dtype=torch.float64)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)
    assert m["dppo/completion_keep_infeasible"] == 0.0
    # allow_zero: the two A == 0 get p = 0 and leave the budget: m = 6, k = (4 - 0.6) / 0.9 = 34/9,
    # the 0.5 pair shares ((34/9 - 3) + (5 - 34/9) * 0.1) / 2 = 0.45
    p, _ = completion_keep_probs(A8, 0.5, "topk", 0.1, allow_zero=True)
    want = torch.tensor([0, 0, 1, 1, 0.45, 0.45, 1, 0.1], dtype=torch.float64)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)


def _topk_reference(absA, keepable, p_min, K):
    # plain loop: sort the keepable items, walk down giving p = 1 while the budget beyond the floors
    # allows, then share the boundary among the items of equal |A|
    idx = sorted((i for i in range(len(absA)) if keepable[i]), key=lambda i: -absA[i])
    m = len(idx)
    k = min(max((K - m * p_min) / (1 - p_min), 0.0), m)
    p = [0.0] * len(absA)
    if not idx:
        return p
    t = absA[idx[min(int(k), m - 1)]]
    a = sum(1 for i in idx if absA[i] > t)
    e = sum(1 for i in idx if absA[i] == t)
    for i in idx:
        p[i] = 1.0 if absA[i] > t else ((k - a) + (a + e - k) * p_min) / e if absA[i] == t else p_min
    return p


@pytest.mark.parametrize("seed", range(6))
def test_topk_matches_a_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    A = torch.randint(-4, 5, (5, 24), generator=g).to(torch.float64) / 2  # many ties and zeros
    valid = torch.rand(5, 24, generator=g) > 0.2
    keep, p_min, allow_zero = 0.2 + 0.15 * seed, 0.05 + 0.02 * seed, seed % 2 == 1
    p, _ = completion_keep_probs(A, keep, "topk", p_min, allow_zero, valid=valid)
    for r in range(5):
        keepable = [bool(v) and not (allow_zero and a == 0) for v, a in zip(valid[r], A[r])]
        ref = _topk_reference(A[r].abs().tolist(), keepable, p_min, keep * int(valid[r].sum()))
        torch.testing.assert_close(p[r], torch.tensor(ref, dtype=torch.float64), rtol=0, atol=1e-12)
