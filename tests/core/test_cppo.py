"""core.cppo: CPPO's draw size and its per-group keep rule (top |A|, ties to the lower index)."""

import pytest
import torch

from openrlhf_dppo.core.cppo import cppo_keep_mask, cppo_kept_per_group, cppo_prompts


@pytest.mark.parametrize(
    "B,P,expected",
    [
        (8, 0.5, 16),
        (8, 0.0, 8),
        (4, 0.75, 16),
        (7, 0.3, 10),
        (3, 0.7, 10),
        (5, 0.1, 5),
        (1, 0.5, 2),
        (6, 0.2, 7),
    ],
)
def test_prompts_drawn_are_int_of_b_over_keep_fraction(B, P, expected):
    assert cppo_prompts(B, P) == expected
    assert cppo_prompts(B, P) >= B


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_rates_outside_zero_one_are_refused(bad):
    with pytest.raises(ValueError, match="prune_rate"):
        cppo_prompts(8, bad)
    with pytest.raises(ValueError, match="prune_rate"):
        cppo_keep_mask(torch.zeros(2, 4), bad)


def test_a_batch_of_no_prompt_is_refused():
    with pytest.raises(ValueError, match="batch_size"):
        cppo_prompts(0, 0.5)


@pytest.mark.parametrize(
    "G,P,kept",
    [
        (8, 0.5, 4),
        (8, 0.0, 8),
        (8, 0.99, 1),
        (4, 0.5, 2),
        (5, 0.5, 3),
        (16, 0.9, 2),
        (100, 0.57, 43),
        (1, 0.5, 1),
        (2, 0.5, 1),
    ],
)
def test_kept_per_group_is_g_minus_int_g_p_and_at_least_one(G, P, kept):
    assert cppo_kept_per_group(G, P) == kept
    mask = cppo_keep_mask(torch.randn(3, G, generator=torch.Generator().manual_seed(G)), P)
    assert mask.dtype == torch.bool and mask.shape == (3, G)
    assert mask.sum(1).tolist() == [kept] * 3


def test_each_group_keeps_its_own_largest_abs_advantages():
    adv = torch.tensor(
        [
            [0.1, -2.0, 0.5, 1.5],  # |A|: 0.1 2.0 0.5 1.5 -> keep 1, 3
            [3.0, 0.0, -0.2, 0.1],  # keep 0, 2 (a group's rule, not the batch's)
            [-0.01, 0.02, 0.03, -0.04],  # small everywhere: still two kept
        ],
        dtype=torch.float64,
    )
    mask = cppo_keep_mask(adv, 0.5)
    assert mask.tolist() == [
        [False, True, False, True],
        [True, False, True, False],
        [False, False, True, True],
    ]


def test_ties_go_to_the_lower_index():
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 2.0, -0.5, 0.5]])
    mask = cppo_keep_mask(adv, 0.5)
    assert mask.tolist() == [
        [True, True, False, False],  # all |A| equal: the first two
        [True, True, False, False],  # an all-equal group (A = 0): CPPO keeps its top-k all the same
        [True, True, False, False],  # 2.0, then the first of the three 0.5s
    ]
    # ties broken the same way over many ties (stable order, not an accident of a small sort)
    many = torch.ones(2, 64)
    assert cppo_keep_mask(many, 0.75)[0].nonzero().flatten().tolist() == list(range(16))


def test_rate_zero_keeps_everything_and_edge_shapes():
    adv = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    assert cppo_keep_mask(adv, 0.0).all()
    assert cppo_keep_mask(torch.zeros(0, 4), 0.5).shape == (0, 4)
    with pytest.raises(ValueError, match="n_groups, G"):
        cppo_keep_mask(torch.zeros(8), 0.5)


def test_the_mask_stays_on_the_advantages_device_and_does_not_change_them():
    adv = torch.tensor([[0.3, -0.9, 0.1, 0.2]], dtype=torch.float64)
    before = adv.clone()
    mask = cppo_keep_mask(adv, 0.5)
    assert mask.device == adv.device
    assert torch.equal(adv, before)


def test_the_cppo_method_needs_a_completion_prune_rate_and_says_what_does_not_apply():
    from openrlhf_dppo.core import DPPOConfig
    from openrlhf_dppo.core.config import DPPOConfigError

    with pytest.raises(DPPOConfigError, match=r"completion_prune_rate 0\.0.*cppo.*the paper's 0\.5") as err:
        DPPOConfig(method="cppo")
    assert err.value.field == "completion_prune_rate"
    # p_min's bound is DPPO's (its keep probabilities); CPPO keeps by rank, so a high rate is fine
    cfg = DPPOConfig(method="cppo", completion_prune_rate=0.95)
    (notice,) = cfg.notices()
    assert "biased by design" in notice and "--dppo.prompt_prune_rate" in notice and "--dppo.p_min" in notice
    with pytest.raises(DPPOConfigError, match="p_min"):
        DPPOConfig(method="dppo", completion_prune_rate=0.95)
