"""Weights, folding and normalisers: hand-derived cases; folding reproduces the weighted PPO-clip loss."""

import pytest
import torch

from openrlhf_dppo.core import (
    combine_weights,
    fold_weights,
    full_batch_normalizer,
    inverse_prob_weights,
    weight_metrics,
    weighted_aggregate,
)


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


def test_combine_and_fold():
    w = combine_weights(torch.tensor([2.0, 1.0]), torch.tensor([[1.0, 4.0], [0.0, 3.0]]))
    assert torch.equal(w, torch.tensor([[2.0, 8.0], [0.0, 3.0]], dtype=torch.float64))
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
