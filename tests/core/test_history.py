"""PromptHistory: hand-derived updates and scores, duplicates, growth, a reference loop over seeds,
exact checkpoint round trips and the memory budget."""

import io

import numpy as np
import pytest
import torch

from openrlhf_dppo.core import PromptHistory


def test_hand_update_and_binary_score():
    h = PromptHistory(capacity=4, decay=0.5, prior=1.0)
    h.update(torch.tensor([3]), torch.tensor([[1.0, 0.0, 1.0, 1.0]]), step=5)
    # succ = 3, n = 4, var = unbiased var of [1, 0, 1, 1] = (3 * 0.0625 + 0.5625) / 3 = 0.25
    assert (h.count[3], h.last_step[3], h.succ[3], h.n[3]) == (1, 5, 3.0, 4.0)
    assert h.var[3] == pytest.approx(0.25)
    # p_hat = (3 + 1) / (4 + 2) = 2/3; score G=4: 1 - (2/3)^4 - (1/3)^4 = 64/81
    assert float(h.success([3])[0]) == pytest.approx(2 / 3)
    assert float(h.score([3])[0]) == pytest.approx(64 / 81)
    h.update([3], torch.zeros(1, 4), step=7)
    # succ = 0.5 * 3 + 0 = 1.5, n = 0.5 * 4 + 4 = 6, var = 0.5 * 0.25 + 0.5 * 0 = 0.125, p_hat = 2.5 / 8
    assert (h.count[3], h.last_step[3], h.succ[3], h.n[3]) == (2, 7, 1.5, 6.0)
    assert h.var[3] == pytest.approx(0.125)
    assert float(h.success([3])[0]) == pytest.approx(0.3125)
    # never seen (inside and beyond the capacity): +inf, i.e. always kept
    assert torch.isinf(h.score([0, 1000])).all()
    assert h.last_step[0] == -1


def test_continuous_rewards_score_is_std():
    h = PromptHistory(decay=0.0)
    h.update([0, 1], torch.tensor([[0.5, 1.5, 1.0], [2.0, 2.0, 2.0]]), step=0)
    assert not h.is_binary()
    # decay 0: the last group only; var([0.5, 1.5, 1.0], ddof=1) = 0.25 -> std 0.5; constant group -> 0
    torch.testing.assert_close(h.score([0, 1]), torch.tensor([0.5, 0.0], dtype=torch.float64))


def _reference(idx_batches, reward_batches, decay, prior, G):
    # plain dict-per-prompt loop of the documented update rules
    st = {}
    for step, (idx, rew) in enumerate(zip(idx_batches, reward_batches)):
        for i, r in zip(idx.tolist(), rew.tolist()):
            c, last, succ, n, var = st.get(i, (0, -1, 0.0, 0.0, 0.0))
            v = float(np.var(r, ddof=1))
            var = v if c == 0 else decay * var + (1 - decay) * v
            st[i] = (c + 1, step, decay * succ + sum(r), decay * n + G, var)
    return st


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_update_matches_reference_loop(seed):
    rng = np.random.default_rng(seed)
    G, decay, prior = 4, 0.7, 2.0
    idx_batches = [torch.from_numpy(rng.integers(0, 30, size=12)) for _ in range(6)]  # repeats included
    reward_batches = [torch.from_numpy(rng.integers(0, 2, size=(12, G)).astype(np.float64)) for _ in range(6)]
    h = PromptHistory(decay=decay, prior=prior)
    for step, (i, r) in enumerate(zip(idx_batches, reward_batches)):
        h.update(i, r, step)
    ref = _reference(idx_batches, reward_batches, decay, prior, G)
    for i, (c, last, succ, n, var) in ref.items():
        assert (h.count[i], h.last_step[i]) == (c, last)
        np.testing.assert_allclose([h.succ[i], h.n[i], h.var[i]], [succ, n, var], rtol=1e-5, atol=1e-6)
        p = (succ + prior) / (n + 2 * prior)
        assert float(h.score([i])[0]) == pytest.approx(1 - p**G - (1 - p) ** G, rel=1e-5)
    assert int(h.count.sum()) == 6 * 12


def test_checkpoint_round_trip_is_exact():
    rng = np.random.default_rng(0)
    h = PromptHistory(decay=0.3, prior=0.5)
    for step in range(3):
        h.update(rng.integers(0, 50, 16), torch.from_numpy(rng.random((16, 8))), step)
    buf = io.BytesIO()
    torch.save(h.state_dict(), buf)
    buf.seek(0)
    h2 = PromptHistory()
    h2.load_state_dict(torch.load(buf, weights_only=True))
    # identical state, and identical after a further update on both
    for a, b in ((h, h2),):
        for k in ("count", "last_step", "succ", "n", "var"):
            assert np.array_equal(getattr(a, k), getattr(b, k))
    nxt = torch.from_numpy(rng.random((4, 8)))
    h.update([1, 2, 70, 1], nxt, 3)
    h2.update([1, 2, 70, 1], nxt, 3)
    assert torch.equal(h.score(range(80)), h2.score(range(80)))
    assert h2.decay == 0.3 and h2.prior == 0.5 and h2.group_size == 8 and not h2.all_binary
    with pytest.raises(ValueError, match="version"):
        h2.load_state_dict({**h.state_dict(), "version": 99})


def test_memory_under_budget_for_a_million_prompts():
    h = PromptHistory(capacity=1_000_000)
    assert h.nbytes / h.capacity == 28  # < 40 bytes per prompt (tokens and mixed: 4 each)
    h.update([1_500_000], torch.ones(1, 2), 0)  # grows on demand
    assert h.capacity >= 1_500_001 and h.count[1_500_000] == 1


def test_input_errors():
    h = PromptHistory()
    with pytest.raises(ValueError, match=r"\(2, G\)"):
        h.update([0, 1], torch.ones(3, 4), 0)
    with pytest.raises(ValueError, match=">= 0"):
        h.update([-1], torch.ones(1, 4), 0)
    with pytest.raises(ValueError, match="decay"):
        PromptHistory(decay=1.0)
    with pytest.raises(ValueError, match="valid: auto, binary, continuous"):
        PromptHistory(reward_kind="ordinal")
    with pytest.raises(AttributeError):
        h.missing  # noqa: B018
    view = h.count
    with pytest.raises(ValueError):
        view[0] = 5  # read-only views


def test_mean_seen_score_is_the_score_an_unseen_prompt_takes_under_the_mean_rule():
    h = PromptHistory(capacity=8, decay=0.5, prior=1.0)
    assert h.mean_seen_score(4) == 1.0  # nothing seen yet: every prompt alike
    h.update([3], torch.tensor([[1.0, 0.0, 1.0, 1.0]]), step=1)  # score 64/81 (hand-derived above)
    h.update([5], torch.ones(1, 4), step=1)  # p_hat = 5/6: 1 - (5/6)^4 - (1/6)^4
    s5 = 1 - (5 / 6) ** 4 - (1 / 6) ** 4
    assert h.mean_seen_score(4) == pytest.approx((64 / 81 + s5) / 2)
    assert torch.isinf(h.score([0])).all()  # the unseen prompt's own score still says "never seen"
