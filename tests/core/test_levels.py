"""prune_prompts / prune_completions: weights use the probabilities actually drawn with, metrics."""

import pytest
import torch

from openrlhf_dppo.core import REQUIRED_KEYS, prune_completions, prune_prompts, step_generator


def test_prune_prompts_fixed_count_and_weights():
    scores = torch.tensor([float("inf"), 0.1, 0.5, 0.9, 0.2, 0.7, 0.3, 0.05], dtype=torch.float64)
    draw, m = prune_prompts(scores, 0.5, 0.1, "systematic", step_generator(1, 0), multiple_of=2)
    assert int(draw.mask.sum()) == 4 and bool(draw.mask[0])  # expected 4 = multiple of 2; unseen kept
    kept = draw.mask
    torch.testing.assert_close(draw.weight[kept], 1.0 / draw.prob[kept], rtol=0, atol=0)
    assert torch.all(draw.weight[~kept] == 0)
    assert m["dppo/prompt_keep_frac"] == 0.5 and m["dppo/prompt_keep_frac_expected"] == pytest.approx(0.5)


def test_the_fixed_size_fallback_is_reported():
    # scores -> q: two unseen prompts at 1 and one scored prompt at its floor 0.5 (sum 2.5); a multiple of
    # 2 is reachable only by moving the unseen prompts (held: [3, 3]); the fallback is taken and reported
    scores = torch.tensor([float("inf"), float("inf"), 0.3], dtype=torch.float64)
    draw, m = prune_prompts(scores, 0.7, 0.5, "systematic", step_generator(1, 0), multiple_of=2)
    assert m["dppo/prompt_fixed_size_fallback"] == 1.0 and m["dppo/prompt_fixed_size_not_multiple"] == 0.0
    assert int(draw.mask.sum()) == 2 and float(draw.prob[:2].max()) < 1.0
    _, m = prune_prompts(scores, 0.7, 0.5, "systematic", step_generator(1, 0), multiple_of=1)
    assert m["dppo/prompt_fixed_size_fallback"] == 0.0


def test_prune_completions_rescaled_probs_and_combined_weights():
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 0.1], dtype=torch.float64)
    pw = torch.full((8,), 2.0, dtype=torch.float64)
    # uniform-low with allow_zero: |A| >= mean |A| (1, -1, 2) at p = 1, the low set (0.5, -0.5, 0.1) at
    # 1/3 (sum 4). Multiple of 3 with the 1s held: the low set cannot go below its floor 3 x 1/3, so the
    # reachable totals are [4, 6] and 6 is the multiple: everything non-zero is kept, weights from that
    draw, m = prune_completions(
        adv, 0.5, "uniform-low", 0.1, True, "systematic", step_generator(0, 0, 1), 3, pw
    )
    assert abs(float(draw.prob.sum()) - 6.0) < 1e-9 and int(draw.mask.sum()) == 6
    kept = draw.mask
    torch.testing.assert_close(draw.weight[kept], 2.0 / draw.prob[kept], rtol=1e-15, atol=0)
    assert not draw.mask[:2].any()  # A == 0 dropped for free
    assert m["dppo/completion_keep_frac"] == 6 / 8
    assert m["dppo/completion_fixed_size_fallback"] == 0.0 == m["dppo/completion_fixed_size_not_multiple"]
    assert m["dppo/weight_max"] == pytest.approx(float(draw.weight.max()))
    assert {k for k in REQUIRED_KEYS if "pack" not in k and "prompt" not in k} <= set(m)
    with pytest.raises(ValueError, match="prompt_weight"):
        prune_completions(adv, 0.5, "uniform-low", 0.1, True, "bernoulli", torch.Generator(), 1, pw[:3])


@pytest.mark.parametrize("design", ["bernoulli", "systematic"])
def test_rate_zero_is_plain_grpo(design):
    # keep_frac 1 without the A == 0 drop: every item kept with weight exactly 1 (DPPO == GRPO)
    adv = torch.randn(64, generator=torch.Generator().manual_seed(0))
    adv[:5] = 0.0
    draw, m = prune_completions(adv, 1.0, "proportional", 0.1, False, design, step_generator(0, 1, 1))
    assert draw.mask.all() and torch.equal(draw.weight, torch.ones(64, dtype=torch.float64))
    assert m["dppo/weight_ess"] == 64.0
    scores = torch.rand(16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pdraw, _ = prune_prompts(scores, 1.0, 0.1, design, step_generator(0, 1, 0))
    assert pdraw.mask.all() and torch.equal(pdraw.weight, torch.ones(16, dtype=torch.float64))


def test_empty_inputs():
    e = torch.zeros(0, dtype=torch.float64)
    draw, m = prune_completions(e, 0.5, "uniform-low", 0.1, True, "systematic", torch.Generator(), 8)
    assert draw.mask.numel() == 0 and m["dppo/completion_keep_frac"] == 0.0 and m["dppo/weight_ess"] == 0.0
    pdraw, m = prune_prompts(e, 0.5, 0.1, "bernoulli", torch.Generator())
    assert pdraw.mask.numel() == 0 and m["dppo/prompt_keep_frac"] == 0.0
