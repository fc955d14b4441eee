"""The estimator's terms (core/estimator.py): group advantages by hand and as OpenRLHF 0.11.2 computes them
(in float64); weights, folding and normalisers by hand, folding reproducing the weighted PPO-clip loss;
the training-reward statistics (the Horvitz-Thompson reward and equal-reward share) by hand, equal to the
plain ones when nothing is prompt-pruned, and unbiased for the drawn batch's over the prompt-pruning draws."""

import math

import pytest
import torch

from openrlhf_dppo.core import (
    fold_weights,
    full_batch_normalizer,
    group_advantages,
    inverse_prob_weights,
    prune_prompts,
    reward_stats,
    step_generator,
    token_whitening,
    weight_metrics,
    weighted_aggregate,
)


def test_group_norm_hand():
    # r = [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3); A = +-0.5 * sqrt(3)
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))
    s = 0.5 * 3**0.5
    torch.testing.assert_close(a, torch.tensor([[s, -s, -s, s]], dtype=torch.float64), rtol=0, atol=1e-8)


def test_dr_grpo_hand():
    # r = [1, 0, 0, 0]: mean 0.25 -> A = r - 0.25
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), "dr_grpo")
    assert torch.equal(a, torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_population_std_option():
    # r = [1, 0]: mean 0.5, population std 0.5 -> A = +-1 (up to eps)
    a = group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float64), unbiased_std=False)
    torch.testing.assert_close(a, torch.tensor([[1.0, -1.0]], dtype=torch.float64), rtol=0, atol=1e-8)


@pytest.mark.parametrize("estimator", ["group_norm", "dr_grpo"])
def test_degenerate_groups(estimator):
    # all-equal 0/1 groups have an exact mean: A == 0 exactly; a group of one has no baseline: 0
    a = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), estimator)
    assert torch.equal(a, torch.zeros(2, 3))
    one = group_advantages(torch.tensor([[0.7], [1.0]]), estimator)
    assert torch.equal(one, torch.zeros(2, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_matches_openrlhf_formula_on_float64_statistics(dtype, seed):
    # OpenRLHF 0.11.2 experience_maker: group_norm = (r - mean) / (r.std(-1) + 1e-9), dr_grpo = r - mean,
    # here taken in float64 (what the GRPO arm's CountingExperienceMaker does too) and returned in dtype
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(7, 8, generator=g).to(dtype)
    r[0] = 0.3  # a constant group of a value float32 cannot hold: 0 exactly, see the next test
    r64 = r.double()
    host_norm = ((r64 - r64.mean(-1, keepdim=True)) / (r64.std(-1, keepdim=True) + 1e-9)).to(dtype)
    host_dr = (r64 - r64.mean(-1, keepdim=True)).to(dtype)
    assert torch.equal(group_advantages(r, "group_norm"), host_norm)
    assert torch.equal(group_advantages(r, "dr_grpo"), host_dr)
    assert group_advantages(r, "group_norm").dtype == dtype


@pytest.mark.parametrize("value", [0.05, 0.01, 0.3, 0.1])
@pytest.mark.parametrize("G", [8, 5, 16])
def test_constant_group_of_an_inexact_reward_gets_zero(value, G):
    """countdown's partial credit: a group of G equal rewards (a wrong answer scores 0.05) that float32
    cannot hold exactly. In float32 their mean can be off by a few 1e-9, and group_norm turns that
    rounding error into advantages of order 1, the same sign for every member (the control below, for
    eight rewards of 0.05); in float64 statistics they are 0 exactly."""
    r = torch.full((3, G), value, dtype=torch.float32)
    for estimator in ("group_norm", "dr_grpo"):
        assert torch.equal(group_advantages(r, estimator), torch.zeros(3, G))
    f32 = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)  # float32 statistics
    if value == 0.05 and G == 8:
        assert f32.abs().min() > 0.5  # -0.75 for each member on this torch: the defect, reproduced


def test_integer_rewards_promoted_to_float32():
    a = group_advantages(torch.tensor([[1, 0]]), "dr_grpo")
    assert a.dtype == torch.float32 and torch.equal(a, torch.tensor([[0.5, -0.5]]))


def test_errors():
    with pytest.raises(ValueError, match="group_norm, dr_grpo, rloo, reinforce_baseline"):
        group_advantages(torch.zeros(2, 2), "reinforce")
    with pytest.raises(ValueError, match="n_groups, G"):
        group_advantages(torch.zeros(4), "group_norm")


def test_reinforce_baselines_group_step_is_the_group_mean_subtracted():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    assert torch.equal(group_advantages(r, "reinforce_baseline"), group_advantages(r, "dr_grpo"))


@pytest.mark.parametrize("seed", range(3))
def test_token_whitening_with_unit_weights_is_openrlhfs_batch_whitening(seed):
    # OpenRLHF 0.11.2 (reinforce_baseline): mean = sum(m v) / sum(m), var = sum(m (v - mean)^2) / sum(m),
    # rstd = clamp(var, 1e-8).rsqrt(), over every action token of the batch
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(5, 7, generator=g, dtype=torch.float64)
    m = torch.rand(5, 7, generator=g) > 0.3
    mean, rstd = token_whitening(v[m], torch.ones(int(m.sum()), dtype=torch.float64))
    host_mean = (v * m).sum() / m.sum()
    host_rstd = (((v - host_mean).pow(2) * m).sum() / m.sum()).clamp(min=1e-8).rsqrt()
    torch.testing.assert_close(mean, host_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rstd, host_rstd, rtol=1e-12, atol=1e-12)
    # the same as a weighted sample: a token of weight 2 counts as two tokens
    dup = torch.cat([v[m], v[m][:3]])
    w = torch.ones(int(m.sum()), dtype=torch.float64)
    w[:3] = 2.0
    for a, b in zip(
        token_whitening(v[m], w), token_whitening(dup, torch.ones(len(dup), dtype=torch.float64))
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert mean.dim() == rstd.dim() == 0 and mean.device == v.device


def test_token_whitening_without_std_norm_only_centres_and_no_weight_gives_identity():
    v, w = torch.tensor([1.0, 3.0]), torch.tensor([1.0, 3.0])
    mean, rstd = token_whitening(v, w, std_norm=False)
    assert float(mean) == 2.5 and float(rstd) == 1.0
    mean, rstd = token_whitening(v, torch.zeros(2))  # only zero-weight fillers were trained
    assert (float(mean), float(rstd)) == (0.0, 1.0)
    assert float(token_whitening(torch.ones(4), torch.ones(4))[1]) == pytest.approx(1e4)  # var clamped
    with pytest.raises(ValueError, match=r"\(N,\)"):
        token_whitening(torch.zeros(2, 2), torch.zeros(2, 2))


def test_rloo_is_the_leave_one_out_baseline_and_openrlhfs_formula():
    # r = [1, 0, 0, 1]: the other three's mean is 1/3 for a 1 and 2/3 for a 0
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64), "rloo")
    torch.testing.assert_close(a, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]], dtype=torch.float64))
    r = torch.randn(6, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    host = r - (r.sum(-1, keepdim=True) - r) / (8 - 1)  # OpenRLHF 0.11.2's rloo branch
    assert torch.equal(group_advantages(r, "rloo"), host)
    assert torch.equal(group_advantages(torch.full((2, 4), 0.05), "rloo"), torch.zeros(2, 4))  # all equal


def test_inverse_prob_weights_hand():
    p = torch.tensor([0.5, 0.25, 1.0, 0.1])
    mask = torch.tensor([True, True, False, False])
    w = inverse_prob_weights(p, mask)
    assert torch.equal(w, torch.tensor([2.0, 4.0, 0.0, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="<= 0"):
        inverse_prob_weights(torch.tensor([0.0, 1.0]), torch.tensor([True, True]))


def test_weight_metrics_hand():
    # w = [1, 2, 2, 5]: mean 2.5, max 5, ESS = 10^2 / (1 + 4 + 4 + 25) = 100 / 34
    m = weight_metrics(torch.tensor([1.0, 2.0, 2.0, 5.0]))
    assert m["dppo/weight_mean"] == 2.5 and m["dppo/weight_max"] == 5.0
    assert m["dppo/weight_ess"] == pytest.approx(100 / 34, abs=1e-12)
    assert m["dppo/weight_ess_frac"] == pytest.approx(25 / 34, abs=1e-12)
    assert all(isinstance(v, float) for v in m.values())
    assert weight_metrics(torch.zeros(0))["dppo/weight_ess"] == 0.0


def test_fold():
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, 0.0]])  # (N, T) per-token advantages
    assert torch.equal(
        fold_weights(adv, torch.tensor([3.0, 0.5])), torch.tensor([[3.0, 3.0, 0], [-1.0, -1.0, 0]])
    )
    assert torch.equal(
        fold_weights(torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5])), torch.tensor([3.0, -1.0])
    )
    with pytest.raises(ValueError, match="weights must have shape"):
        fold_weights(adv, torch.ones(3))


@pytest.mark.parametrize("seed", range(4))
def test_folding_reproduces_weighted_clipped_losses(seed):
    # PPO clip and dual clip: clipping depends on sign(A) only, so loss(w * A) == w * loss(A) for w > 0
    g = torch.Generator().manual_seed(seed)
    N, T, eps, c = 6, 5, 0.2, 3.0
    ratio = torch.exp(torch.randn(N, T, generator=g, dtype=torch.float64) * 0.5)
    adv = torch.randn(N, 1, generator=g, dtype=torch.float64).expand(N, T)
    w = torch.rand(N, generator=g, dtype=torch.float64) * 10 + 0.1

    def clip_loss(a):
        surr = -torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
        dual = torch.min(surr, -c * a)
        return torch.where(a < 0, dual, surr)

    torch.testing.assert_close(
        clip_loss(fold_weights(adv, w)), w[:, None] * clip_loss(adv), rtol=1e-14, atol=0
    )


def test_weighted_aggregate_hand():
    loss = torch.tensor([[1.0, 3.0, 9.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    w = torch.tensor([2.0, 0.5])
    # token level: (2 * (1 + 3) + 0.5 * 2) / Z = 9 / 10, times dp_size 2
    assert float(weighted_aggregate(loss, mask, w, 10.0, True, dp_size=2)) == pytest.approx(1.8)
    # sequence level: (2 * mean(1, 3) + 0.5 * mean(2)) / Z = (4 + 1) / 4
    assert float(weighted_aggregate(loss, mask, w, 4.0, False)) == pytest.approx(1.25, rel=1e-6)


def test_normalizers():
    assert full_batch_normalizer(False, num_prompts=8, group_size=4)[0] == 32.0
    # HT: sum_j w_j * T_j over rolled-out prompts = 2 * 100 + 1 * 50
    z, m = full_batch_normalizer(True, 8, 4, torch.tensor([2.0, 1.0]), torch.tensor([100, 50]))
    assert z == 250.0 and m == {"dppo/normalizer": 250.0}
    with pytest.raises(ValueError, match="needs prompt_weights"):
        full_batch_normalizer(True, 8, 4)
    with pytest.raises(ValueError, match="must match"):
        full_batch_normalizer(True, 8, 4, torch.ones(2), torch.ones(3))


def test_ht_token_count_unbiased():
    # E[sum_j 1{kept} / q_j * T_j] = sum_j T_j: Monte-Carlo over independent prompt draws
    R = 100000
    q = torch.tensor([1.0, 0.5, 0.2, 0.1], dtype=torch.float64)
    T = torch.tensor([300.0, 100.0, 40.0, 500.0], dtype=torch.float64)
    mask = torch.rand(R, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) < q
    z = (mask / q * T).sum(1)
    se = z.std() / R**0.5
    assert abs(float(z.mean() - T.sum())) < 4 * float(se)


@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_aggregate_invariant_to_packing_and_sharding(token_level, seed):
    # with the global normaliser Z, summing micro-batch losses per rank and averaging over ranks (as
    # DeepSpeed does with the dp_size factor) gives the single-process loss for any pack plan
    from openrlhf_dppo.core import pack

    g = torch.Generator().manual_seed(seed)
    N, T, dp = 37, 12, 4
    loss = torch.randn(N, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    w = torch.rand(N, generator=g, dtype=torch.float64) * 5
    Z = float(mask.sum()) if token_level else float(N)
    whole = weighted_aggregate(loss, mask, w, Z, token_level)
    plan, _ = pack(lengths, 30, dp_size=dp)
    per_rank = [
        sum(weighted_aggregate(loss[mb], mask[mb], w[mb], Z, token_level, dp) for mb in rank if mb)
        for rank in plan.rank_micro_batches
    ]
    torch.testing.assert_close(sum(per_rank) / dp, whole, rtol=1e-12, atol=1e-12)


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
