"""What the prompt policies read from PromptHistory (``signals``): the posterior mean E[v] of the group's
gradient second moment (hand-derived cases and a Monte-Carlo over Beta draws), the prompts' costs (a
discounted mean of their response tokens), the unseen rules, and a checkpoint round trip that keeps the
costs and therefore the draws."""

import io

import numpy as np
import pytest
import torch

from openrlhf_dppo.core import PromptHistory, prune_prompts, step_generator


def test_posterior_mean_of_a_mixed_group_by_hand():
    # G = 2, prior 1, one group [1, 0]: a = 1 + 1 = 2, b = 2 - 1 + 1 = 2.
    # E[p^2] = (2 / 4)(3 / 5) = 0.3 = E[(1 - p)^2] -> E[P(mixed)] = 1 - 0.3 - 0.3 = 0.4, below the plug-in
    # score 1 - 0.5^2 - 0.5^2 = 0.5 (the posterior's spread makes an all-equal group likelier).
    # dr_grpo: E[p (1 - p)] = a b / ((a + b)(a + b + 1)) = 4 / 20 = 0.2
    h = PromptHistory(decay=0.5, prior=1.0)
    h.update([0], torch.tensor([[1.0, 0.0]]), 0)
    assert float(h.moment([0], 2)[0]) == pytest.approx(0.4, abs=1e-12)
    assert float(h.score([0], 2)[0]) == pytest.approx(0.5, abs=1e-12)
    assert float(h.moment([0], 2, "dr_grpo")[0]) == pytest.approx(0.2, abs=1e-12)
    # G = 4, group [1, 0, 1, 1]: a = 4, b = 2. E[p^4] = 4*5*6*7 / (6*7*8*9) = 5/18,
    # E[(1 - p)^4] = 2*3*4*5 / (6*7*8*9) = 5/126 -> 1 - 5/18 - 5/126 = 43/63
    h.update([1], torch.tensor([[1.0, 0.0, 1.0, 1.0]]), 0)
    assert float(h.moment([1], 4)[0]) == pytest.approx(43 / 63, abs=1e-7)
    assert torch.isinf(h.moment([2, 100], 4)).all()  # never seen


@pytest.mark.parametrize("a_succ,n,prior,G", [(3.0, 4.0, 1.0, 4), (0.5, 6.0, 0.25, 8), (5.5, 6.0, 1.0, 16)])
def test_posterior_mean_matches_a_monte_carlo_over_beta_draws(a_succ, n, prior, G):
    # discounted (fractional) counts set directly through one update at decay 0 of a G'-group would not
    # reach every (succ, n); the closed form is checked on the stored counts instead
    h = PromptHistory(decay=0.0, prior=prior)
    h.update([0], torch.zeros(1, 2), 0)
    h._a["succ"][0], h._a["n"][0] = a_succ, n
    a, b = a_succ + prior, n - a_succ + prior
    p = np.random.default_rng(0).beta(a, b, size=400_000)
    for estimator, v in (("group_norm", 1 - p**G - (1 - p) ** G), ("dr_grpo", p * (1 - p))):
        se = v.std() / np.sqrt(v.size)
        assert abs(float(h.moment([0], G, estimator)[0]) - v.mean()) < 4 * se, estimator


def test_continuous_rewards_take_the_estimated_variance_outside_group_norm():
    h = PromptHistory(decay=0.0)
    h.update([0], torch.tensor([[0.5, 1.5, 1.0]]), 0)  # var(ddof=1) = 0.25
    for estimator in ("dr_grpo", "rloo", "reinforce_baseline"):
        assert float(h.moment([0], 3, estimator)[0]) == pytest.approx(0.25)


def test_group_norm_with_continuous_rewards_takes_the_posterior_chance_of_a_mixed_group():
    # std normalisation: a group of 0 and 0.05 (partial credit) carries as much as a solve; only an
    # all-equal group carries none, so E[v] is P(not all equal), not the reward variance
    h = PromptHistory(decay=0.5, prior=1.0)
    small = torch.tensor([[0.0, 0.05, 0.0, 0.0]])
    h.update([0], small, 0)  # mixed: 1 of 1 group
    h.update([1], torch.full((1, 4), 0.05), 0)  # all equal
    h.update([1], small, 1)  # then mixed: mixed 0.5 * 0 + 1 = 1, groups 0.5 * 1 + 1 = 1.5
    h.update([2], torch.zeros(1, 4), 0)
    h.update([2], torch.zeros(1, 4), 1)  # never mixed: groups 1.5
    v = h.moment([0, 1, 2, 9], 4)
    assert not h.is_binary()
    assert float(v[0]) == pytest.approx((1 + 1) / (1 + 2))
    assert float(v[1]) == pytest.approx((1 + 1) / (1.5 + 2))
    assert float(v[2]) == pytest.approx((0 + 1) / (1.5 + 2))
    assert torch.isinf(v[3])  # never seen
    assert float(v[0]) > float(v[2]) and float(h.moment([0], 4, "dr_grpo")[0]) < 0.001  # the variance's view


def test_costs_are_a_discounted_mean_of_the_response_tokens():
    h = PromptHistory(decay=0.5)
    assert float(h.cost([0])[0]) == 1.0  # nothing recorded: every cost alike
    h.update([3], torch.ones(1, 4), 0, tokens=torch.tensor([[10, 20, 30, 40]]))  # first: sets 25
    h.update([3], torch.ones(1, 4), 1, tokens=torch.tensor([[5, 5, 5, 5]]))  # 0.5 * 25 + 0.5 * 5 = 15
    h.update([4], torch.ones(1, 4), 1, tokens=torch.tensor([[35, 35, 35, 35]]))
    h.update([5], torch.ones(1, 4), 1)  # no lengths: takes the mean of the known costs
    torch.testing.assert_close(
        h.cost([3, 4, 5, 9]), torch.tensor([15.0, 35.0, 25.0, 25.0], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="tokens must have the shape"):
        h.update([3], torch.ones(1, 4), 2, tokens=torch.ones(1, 3))


def test_unseen_prompts_are_pinned_or_take_the_mean_ratio():
    h = PromptHistory(decay=0.5, prior=1.0)
    h.update([0, 1], torch.tensor([[1.0, 0.0], [1.0, 1.0]]), 0, tokens=torch.tensor([[2, 2], [8, 8]]))
    keep = h.signals([0, 1, 7], 2, unseen="keep")
    assert keep.unseen.tolist() == [False, False, True] and keep.pinned.tolist() == [False, False, True]
    mean = h.signals([0, 1, 7], 2, unseen="mean")
    assert not mean.pinned.any() and mean.unseen.tolist() == [False, False, True]
    v, c = h.moment([0, 1], 2), h.cost([0, 1])
    ratio = float((v / c).mean())  # the unseen prompt's E[v] / c is the seen prompts' mean
    assert float(mean.moment[2] / mean.cost[2]) == pytest.approx(ratio)
    assert float(mean.cost[2]) == pytest.approx(5.0) and float(mean.score[2]) == pytest.approx(
        h.mean_seen_score(2)
    )
    with pytest.raises(ValueError, match="unseen rule"):
        h.signals([0], 2, unseen="drop")


def _history():
    rng = np.random.default_rng(1)
    h = PromptHistory(decay=0.5, prior=0.5)
    for step in range(3):
        idx = rng.integers(0, 40, 12)
        h.update(idx, torch.from_numpy((rng.random((12, 4)) < 0.4).astype(np.float64)), step,
                 tokens=torch.from_numpy(rng.integers(1, 200, (12, 4))))  # fmt: skip
    return h


def test_a_resumed_history_keeps_the_costs_and_draws_what_the_uninterrupted_one_draws():
    h = _history()
    buf = io.BytesIO()
    torch.save(h.state_dict(), buf)
    buf.seek(0)
    resumed = PromptHistory()
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert np.array_equal(resumed.tokens, h.tokens) and h.tokens.max() > 0
    idx = torch.arange(40)
    for policy in ("proportional", "sqrt", "uniform"):
        for unseen in ("keep", "mean"):
            a, b = (x.signals(idx, 4, unseen=unseen) for x in (h, resumed))
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            da, _ = prune_prompts(a, 0.5, 0.1, "systematic", step_generator(7, 3, 0), policy=policy)
            db, _ = prune_prompts(b, 0.5, 0.1, "systematic", step_generator(7, 3, 0), policy=policy)
            assert torch.equal(da.mask, db.mask) and torch.equal(da.prob, db.prob)


def test_a_version_1_state_loads_with_no_length_recorded():
    h = _history()
    state = {k: v for k, v in h.state_dict().items() if k != "tokens"}
    old = PromptHistory()
    old.load_state_dict({**state, "version": 1})
    assert torch.equal(old.score(torch.arange(40), 4), h.score(torch.arange(40), 4))
    assert torch.equal(old.cost(torch.arange(40)), torch.ones(40, dtype=torch.float64))


def test_a_version_2_state_loads_with_a_mixed_count_from_the_reward_variance():
    h = PromptHistory(decay=0.5)
    h.update([0, 1], torch.tensor([[0.0, 0.05, 0.0, 0.0], [0.05, 0.05, 0.05, 0.05]]), 0)
    h.update([0, 1], torch.tensor([[0.0, 0.05, 0.0, 0.0], [0.05, 0.05, 0.05, 0.05]]), 1)
    state = {k: v for k, v in h.state_dict().items() if k != "mixed"}
    old = PromptHistory()
    old.load_state_dict({**state, "version": 2})
    # prompt 0 was mixed every time (variance > 0): the same posterior; prompt 1 never (variance 0)
    torch.testing.assert_close(old.moment([0, 1], 4), h.moment([0, 1], 4))
    assert old.state_dict()["version"] == 3
