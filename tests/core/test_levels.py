"""prune_prompts / prune_completions: weights use the probabilities actually drawn with, metrics."""

import pytest
import torch

from openrlhf_dppo.core import REQUIRED_KEYS, prune_completions, prune_prompts, step_generator


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
