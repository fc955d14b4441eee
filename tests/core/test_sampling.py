"""The draws (core/sampling.py): systematic sampling's exact marginals (Monte-Carlo), fixed kept counts, the
multiple-of rescale, never an empty draw, seeding, the vectorised draw against a plain loop over seeds;
prune_prompts / prune_completions: the weights use the probabilities actually drawn with, and their metrics."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from openrlhf_dppo.core import (
    FIXED_SIZE_FALLBACK,
    FIXED_SIZE_HELD,
    FIXED_SIZE_NOT_MULTIPLE,
    REQUIRED_KEYS,
    fixed_size_probs,
    prune_completions,
    prune_prompts,
    sample_mask,
    step_generator,
)
from openrlhf_dppo.core.sampling import _systematic

P6 = torch.tensor([0.1, 0.35, 0.5, 0.05, 1.0, 0.0], dtype=torch.float64)  # sums to 2.0


def test_marginals_equal_the_inclusion_probabilities():
    R = 40000
    gen = torch.Generator().manual_seed(1)
    mask, p_used = sample_mask(P6.expand(R, 6).contiguous(), gen)
    assert torch.equal(p_used[0], P6)  # the sum is already an integer: no rescale
    freq = mask.double().mean(0)
    se = (P6 * (1 - P6) / R).sqrt()
    assert torch.all((freq - P6).abs() <= 4 * se + 1e-12), (freq, P6)
    assert torch.all(mask[:, 4]) and not mask[:, 5].any()  # p = 1 always, p = 0 never
    assert torch.all(mask.sum(1) == 2)  # the kept count is exactly sum(p)


def test_systematic_hand():
    # p = [0.5, 0.5, 0.5, 0.5] in the order given by the permutation, start u: cumulative sums
    # 0.5, 1, 1.5, 2; the points u and u + 1 hit exactly one item of each pair (i.e. two items)
    gen = torch.Generator().manual_seed(0)
    mask, _ = sample_mask(torch.full((4,), 0.5, dtype=torch.float64), gen)
    assert int(mask.sum()) == 2


@settings(max_examples=50, deadline=None)
@given(
    p=st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5, 0.77, 1.0]), min_size=1, max_size=50),
    m=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fixed_size_rescale_properties(p, m, seed):
    P = torch.tensor(p, dtype=torch.float64)
    q, status = fixed_size_probs(P, m)
    pos = P > 0
    assert torch.all(q[~pos] == 0) and torch.all(q <= 1)
    if pos.any():
        floor = float(P[pos].min())
        assert torch.all(q[pos] >= floor - 1e-12)  # floors survive
    total = float(q.sum())
    assert abs(total - round(total)) < 1e-9
    if int(status) != FIXED_SIZE_NOT_MULTIPLE:
        assert round(total) % m == 0
    if int(status) != FIXED_SIZE_FALLBACK:
        assert torch.all(q[P == 1.0] == 1.0)  # p = 1 items are held at 1
    else:  # the fallback only when no multiple was reachable with them held
        held, free = int((P == 1).sum()), int(((P > 0) & (P < 1)).sum())
        low = held + math.ceil(free * float(P[(P > 0) & (P < 1)].min()) - 1e-9) if free else held
        assert not any(k % m == 0 for k in range(low, held + free + 1))
    again, _ = fixed_size_probs(q, m)
    assert torch.equal(again, q)  # a row already at its multiple is left unchanged
    mask, _ = sample_mask(P, step_generator(seed, 0), multiple_of=m)
    assert int(mask.sum()) == round(total)
    assert not mask[~pos].any()


def test_fixed_size_hand():
    # p = 0.35 * 10 = 3.5, multiple of 4 -> nearest multiple 4: q = 0.4 each (scale 8/7, no clipping)
    q, status = fixed_size_probs(torch.full((10,), 0.35, dtype=torch.float64), 4)
    torch.testing.assert_close(q, torch.full((10,), 0.4, dtype=torch.float64), rtol=0, atol=1e-12)
    assert int(status) == FIXED_SIZE_HELD
    # p = 0.9 * 10: floors 0.9 each -> feasible totals [9, 10] hold no multiple of 8: the integer 9
    q, status = fixed_size_probs(torch.full((10,), 0.9, dtype=torch.float64), 8)
    assert int(status) == FIXED_SIZE_NOT_MULTIPLE and abs(float(q.sum()) - 9.0) < 1e-12


def test_fixed_size_holds_the_p_equal_1_items_and_rescales_the_others():
    # three items at p = 1 and three at 0.4: sum 4.2, nearest integer 4. With the 1s held the
    # others would need 1.0 in all, below their floor 3 x 0.4 = 1.2: totals [5, 6] are reachable and 5
    # is nearest, so the others rise to 2/3 each (scale 5/3). Scaling every item would have reached 4 by
    # moving the p = 1 items down to 0.9333.
    p = torch.tensor([1.0, 1.0, 1.0, 0.4, 0.4, 0.4], dtype=torch.float64)
    q, status = fixed_size_probs(p, 1)
    torch.testing.assert_close(
        q, torch.tensor([1, 1, 1, 2 / 3, 2 / 3, 2 / 3], dtype=torch.float64), rtol=0, atol=1e-12
    )
    assert int(status) == FIXED_SIZE_HELD


def test_fixed_size_falls_back_to_scaling_every_item_only_when_holding_them_reaches_no_multiple():
    # four 1s and one 0.5 (sum 4.5), multiple of 4: with the 1s held the reachable totals are [5, 5], no
    # multiple of 4. Scaling every item (floor 0.5): 4c + 0.5 = 4 -> c = 0.875, status FALLBACK.
    p = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    q, status = fixed_size_probs(p, 4)
    torch.testing.assert_close(q, torch.tensor([0.875] * 4 + [0.5], dtype=torch.float64), rtol=0, atol=1e-12)
    assert int(status) == FIXED_SIZE_FALLBACK


def test_multiple_of_unbiased_with_p_used():
    # the rescaled probabilities are the inclusion probabilities actually realised
    R = 40000
    P = torch.tensor([0.2, 0.3, 0.45, 0.6, 0.9, 0.1, 0.15], dtype=torch.float64)  # sum 2.7 -> 4 at m = 4
    mask, p_used = sample_mask(P.expand(R, 7).contiguous(), torch.Generator().manual_seed(5), 4)
    q = p_used[0]
    assert abs(float(q.sum()) - 4.0) < 1e-9 and torch.all(mask.sum(1) == 4)
    se = (q * (1 - q) / R).sqrt()
    assert torch.all((mask.double().mean(0) - q).abs() <= 4 * se + 1e-12)


def _systematic_loop(p, perm, u):
    # textbook systematic sampling over the permuted items: points u, u+1, ... on the cumulative line
    kept, acc, point = set(), 0.0, u
    for j in perm:
        if p[j] >= 1.0:
            kept.add(j)
            continue
        acc += p[j]
        while point < acc - 1e-12:
            kept.add(j)
            point += 1.0
    return kept


@pytest.mark.parametrize("seed", range(10))
def test_systematic_matches_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    p = (torch.rand(3, 20, generator=g, dtype=torch.float64) * 0.9).round(decimals=2)
    p[:, :2] = 1.0
    mask = _systematic(p, torch.Generator().manual_seed(100 + seed))
    # replay the same random numbers: one permutation draw then one start per row
    rg = torch.Generator().manual_seed(100 + seed)
    perm = torch.rand(3, 20, generator=rg, dtype=torch.float64).argsort(dim=1)
    u = torch.rand(3, 1, generator=rg, dtype=torch.float64)
    for r in range(3):
        want = _systematic_loop(p[r].tolist(), perm[r].tolist(), float(u[r]))
        assert set(torch.nonzero(mask[r]).flatten().tolist()) == want


def test_reproducible_and_streams_differ():
    p = torch.full((64,), 0.5, dtype=torch.float64)
    a, _ = sample_mask(p, step_generator(42, 3, 1))
    b, _ = sample_mask(p, step_generator(42, 3, 1))
    c, _ = sample_mask(p, step_generator(42, 3, 0))
    d, _ = sample_mask(p, step_generator(42, 4, 1))
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)


@settings(max_examples=50, deadline=None)
@given(
    p=st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.3]), min_size=1, max_size=30),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_row_with_a_positive_probability_never_keeps_nothing(p, seed):
    # the rescale moves sum(p) to an integer at least the ceiling of the floors, so at least 1
    P = torch.tensor(p, dtype=torch.float64)
    mask, p_used = sample_mask(P, step_generator(seed, 0))
    assert bool(mask.any()) == bool((P > 0).any())
    assert abs(float(p_used.sum()) - int(mask.sum())) < 1e-9


def test_errors():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sample_mask(torch.tensor([1.5]), torch.Generator())
    with pytest.raises(ValueError, match="multiple_of"):
        sample_mask(P6, torch.Generator(), multiple_of=0)


def test_prune_prompts_fixed_count_and_weights():
    scores = torch.tensor([0.4, 0.1, 0.5, 0.9, 0.2, 0.7, 0.3, 0.05], dtype=torch.float64)
    unseen = torch.tensor([True] + [False] * 7)
    draw, m = prune_prompts(scores, 0.5, 0.1, step_generator(1, 0), unseen=unseen)
    assert int(draw.mask.sum()) == 4  # expected 4, exactly
    kept = draw.mask
    torch.testing.assert_close(draw.weight[kept], 1.0 / draw.prob[kept], rtol=0, atol=0)
    assert torch.all(draw.weight[~kept] == 0)
    assert m["dppo/prompt_keep_frac"] == 0.5 and m["dppo/prompt_keep_frac_expected"] == pytest.approx(0.5)
    assert m["dppo/prompt_unseen_frac"] == 1 / 8


def test_a_prompt_draw_is_rescaled_to_a_whole_count_and_never_keeps_nothing():
    # keep 0.1 of 3 prompts: 0.3 expected, the floors 3 x 0.1 -> a whole count of 1, q = 1/3 each
    scores = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    for seed in range(20):
        draw, m = prune_prompts(scores, 0.1, 0.1, step_generator(seed, 0), policy="uniform")
        assert int(draw.mask.sum()) == 1 and torch.allclose(draw.prob, torch.full((3,), 1 / 3).double())
    assert m["dppo/prompt_keep_frac_expected"] == pytest.approx(1 / 3)


def test_prune_completions_rescaled_probs_and_combined_weights():
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 0.1], dtype=torch.float64)
    pw = torch.full((8,), 2.0, dtype=torch.float64)
    # uniform-low with allow_zero: |A| >= mean |A| (1, -1, 2) at p = 1, the low set (0.5, -0.5, 0.1) at
    # 1/3 (sum 4). Multiple of 3 with the 1s held: the low set cannot go below its floor 3 x 1/3, so the
    # reachable totals are [4, 6] and 6 is the multiple: everything non-zero is kept, weights from that
    draw, m = prune_completions(adv, 0.5, 0.1, True, step_generator(0, 0, 1), 3, pw)
    assert abs(float(draw.prob.sum()) - 6.0) < 1e-9 and int(draw.mask.sum()) == 6
    kept = draw.mask
    torch.testing.assert_close(draw.weight[kept], 2.0 / draw.prob[kept], rtol=1e-15, atol=0)
    assert not draw.mask[:2].any()  # A == 0 dropped for free
    assert m["dppo/completion_keep_frac"] == 6 / 8
    assert m["dppo/completion_fixed_size_fallback"] == 0.0 == m["dppo/completion_fixed_size_not_multiple"]
    assert m["dppo/weight_max"] == pytest.approx(float(draw.weight.max()))
    assert {k for k in REQUIRED_KEYS if "pack" not in k and "prompt" not in k} <= set(m)
    with pytest.raises(ValueError, match="prompt_weight"):
        prune_completions(adv, 0.5, 0.1, True, torch.Generator(), 1, pw[:3])


def test_the_completion_fixed_size_fallback_is_reported():
    # four |A| = 1 items at p = 1 and one low item at 0.5 (keep 0.9 of 5 = 4.5), a multiple of 4: with the
    # 1s held the reachable totals are [5, 5], so every item is scaled (the fallback), reported
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.1], dtype=torch.float64)
    draw, m = prune_completions(adv, 0.9, 0.5, False, step_generator(0, 0, 1), 4)
    assert m["dppo/completion_fixed_size_fallback"] == 1.0 and int(draw.mask.sum()) == 4
    _, m = prune_completions(adv, 0.9, 0.5, False, step_generator(0, 0, 1), 1)
    assert m["dppo/completion_fixed_size_fallback"] == 0.0


def test_rate_zero_is_plain_grpo():
    # keep_frac 1 without the A == 0 drop: every item kept with weight exactly 1 (DPPO == GRPO)
    adv = torch.randn(64, generator=torch.Generator().manual_seed(0))
    adv[:5] = 0.0
    draw, m = prune_completions(adv, 1.0, 0.1, False, step_generator(0, 1, 1))
    assert draw.mask.all() and torch.equal(draw.weight, torch.ones(64, dtype=torch.float64))
    assert m["dppo/weight_ess"] == 64.0
    scores = torch.rand(16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pdraw, _ = prune_prompts(scores, 1.0, 0.1, step_generator(0, 1, 0))
    assert pdraw.mask.all() and torch.equal(pdraw.weight, torch.ones(16, dtype=torch.float64))


def test_empty_inputs():
    e = torch.zeros(0, dtype=torch.float64)
    draw, m = prune_completions(e, 0.5, 0.1, True, torch.Generator(), 8)
    assert draw.mask.numel() == 0 and m["dppo/completion_keep_frac"] == 0.0 and m["dppo/weight_ess"] == 0.0
    pdraw, m = prune_prompts(e, 0.5, 0.1, torch.Generator())
    assert pdraw.mask.numel() == 0 and m["dppo/prompt_keep_frac"] == 0.0
