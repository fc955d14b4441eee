"""Training-reward statistics: the Horvitz-Thompson reward and equal-reward share by hand, equal to the
plain ones when nothing is prompt-pruned, and unbiased for the drawn batch's over the prompt-pruning draws."""

import math

import pytest
import torch

from openrlhf_dppo.core import prune_prompts, reward_stats, step_generator


def test_reward_ht_by_hand():
    # 3 rolled-out prompts of B_drawn = 5, G = 4. Group sums 3, 0, 4; divided by q = 0.5, 1, 0.25:
    # 6 + 0 + 16 = 22, over B_drawn * G = 20 -> 1.1. Plain mean 7 / 12; 7 ones and 5 zeros around
    # 7/12: unbiased variance (7 * (5/12)^2 + 5 * (7/12)^2) / 11 = 420 / 1584.
    r = torch.tensor([[1.0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    m = reward_stats(r, torch.tensor([0.5, 1.0, 0.25]), num_drawn=5)
    assert m["rollout/reward_ht"] == pytest.approx(1.1, abs=1e-15)
    assert m["rollout/reward_mean"] == pytest.approx(7 / 12, abs=1e-15)
    assert m["rollout/reward_std"] == pytest.approx(math.sqrt(420 / 1584), abs=1e-15)
    # groups 2 and 3 have all-equal rewards: 2 of 3 rolled out; HT (0 / 0.5 + 1 / 1 + 1 / 0.25) / 5 = 1
    assert m["rollout/equal_reward_frac"] == pytest.approx(2 / 3, abs=1e-15)
    assert m["rollout/equal_reward_frac_ht"] == pytest.approx(1.0, abs=1e-15)
    assert all(isinstance(v, float) for v in m.values())


def test_equal_reward_share_compares_continuous_rewards_exactly():
    # countdown's partial credit: 0.05 for a well-formed wrong answer, so [0.05, 0, 0.05] is a mixed group
    r = torch.tensor([[0.05, 0.05, 0.05], [0.05, 0.0, 0.05], [0.0, 0.0, 0.0], [1.0, 1.0, 0.05]])
    m = reward_stats(r)
    assert m["rollout/equal_reward_frac"] == m["rollout/equal_reward_frac_ht"] == 0.5
    assert reward_stats(torch.ones(0, 4))["rollout/equal_reward_frac"] == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_without_prompt_pruning_reward_ht_is_the_reward_mean_exactly(seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(7, 5, generator=g, dtype=torch.float64) * 3 - 1  # non-binary: summation order matters
    m = reward_stats(r)
    assert m["rollout/reward_ht"] == m["rollout/reward_mean"]  # the same float, not just close
    assert m["rollout/equal_reward_frac_ht"] == m["rollout/equal_reward_frac"]
    assert m["rollout/reward_mean"] == pytest.approx(float(r.mean()), rel=1e-14)
    assert reward_stats(r, torch.ones(7), num_drawn=7) == m


def test_reward_ht_is_unbiased_for_the_drawn_batch_mean_over_prompt_draws():
    """Monte-Carlo over the seeded prompt-pruning draws (as the samples generator draws): the mean of
    reward_ht is the drawn batch's mean reward (and equal_reward_frac_ht its share of all-equal groups);
    the mean over rolled-out prompts is tilted away from it."""
    g = torch.Generator().manual_seed(0)
    B, G = 8, 4
    rewards = (torch.rand(B, G, generator=g) < torch.linspace(0.05, 0.95, B)[:, None]).double()
    scores = torch.tensor([0.1, 0.9, 0.3, 0.05, 0.7, 0.5, 0.2, 0.8], dtype=torch.float64)
    rewards[1] = 1.0  # two groups of equal rewards at least, one kept with a high q, one with a low
    rewards[3] = 0.0
    truth = float(rewards.mean())
    truth_equal = float((rewards == rewards[:, :1]).all(1).double().mean())  # groups 1, 3 and chance ones
    ht, plain, ht_equal = [], [], []
    for r in range(4000):
        draw, _ = prune_prompts(scores, 0.5, 0.1, step_generator(3, r, 0))
        kept = draw.mask
        m = reward_stats(rewards[kept], draw.prob[kept], num_drawn=B)
        ht.append(m["rollout/reward_ht"])
        plain.append(m["rollout/reward_mean"])
        ht_equal.append(m["rollout/equal_reward_frac_ht"])
    ht, plain, ht_equal = torch.tensor(ht), torch.tensor(plain), torch.tensor(ht_equal)
    se = ht.std() / len(ht) ** 0.5
    assert abs(float(ht.mean()) - truth) < 4 * se
    assert ht_equal.std() > 0.1  # the share varies from draw to draw, and its mean is unbiased
    assert abs(float(ht_equal.mean()) - truth_equal) < 4 * ht_equal.std() / len(ht_equal) ** 0.5
    assert abs(float(plain.mean()) - truth) > 10 * plain.std() / len(plain) ** 0.5  # the test has teeth


def test_reward_stats_refuses_bad_input():
    with pytest.raises(ValueError, match=r"\(n, G\)"):
        reward_stats(torch.ones(4))
    with pytest.raises(ValueError, match="num_drawn"):
        reward_stats(torch.ones(3, 2), num_drawn=2)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        reward_stats(torch.ones(2, 2), torch.tensor([0.0, 1.0]))
