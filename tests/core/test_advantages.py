"""Group advantages: hand-derived cases and exact agreement with OpenRLHF 0.11.2's formulas (in float64)."""

import pytest
import torch

from openrlhf_dppo.core import group_advantages, token_whitening


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
