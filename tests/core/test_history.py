"""The prompt level's state (core/history.py). PromptHistory: hand-derived updates and scores, duplicates,
growth, a reference loop over seeds, the score an unseen prompt takes, exact checkpoint round trips (older
versions too) and the memory budget. PromptRateControl (``--dppo.prompt_rate_control``): the rate of each
draw by hand, its state through a checkpoint (its unbiasedness: test_unbiased.py; through the trainer:
tests/adapters)."""

import io
import math

import numpy as np
import pytest
import torch

from openrlhf_dppo.core import (
    ZERO_SHARE_CAP,
    DPPOConfig,
    PromptHistory,
    PromptRateControl,
    prune_prompts,
    step_generator,
)
from openrlhf_dppo.core.history import DECAY, PRIOR


def test_hand_update_and_binary_score():
    assert (DECAY, PRIOR) == (0.5, 1.0)
    h = PromptHistory(capacity=4)
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
    # never seen (inside and beyond the capacity): +inf
    assert torch.isinf(h.score([0, 1000])).all()
    assert h.last_step[0] == -1


def test_continuous_rewards_score_is_std():
    h = PromptHistory()
    h.update([0, 1], torch.tensor([[0.5, 1.5, 1.0], [2.0, 2.0, 2.0]]), step=0)
    assert not h.all_binary
    # the first rollout sets var; var([0.5, 1.5, 1.0], ddof=1) = 0.25 -> std 0.5; constant group -> 0
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
    G, decay, prior = 4, DECAY, PRIOR
    idx_batches = [torch.from_numpy(rng.integers(0, 30, size=12)) for _ in range(6)]  # repeats included
    reward_batches = [torch.from_numpy(rng.integers(0, 2, size=(12, G)).astype(np.float64)) for _ in range(6)]
    h = PromptHistory()
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
    h = PromptHistory()
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
    assert h2.group_size == 8 and not h2.all_binary
    with pytest.raises(ValueError, match="version"):
        h2.load_state_dict({**h.state_dict(), "version": 99})
    # a state made with other constants than this version's is refused
    with pytest.raises(ValueError, match="decay, prior, reward kind"):
        h2.load_state_dict({**h.state_dict(), "decay": 0.9})


def test_memory_under_budget_for_a_million_prompts():
    h = PromptHistory(capacity=1_000_000)
    assert h.nbytes / h.capacity == 20  # < 40 bytes per prompt
    h.update([1_500_000], torch.ones(1, 2), 0)  # grows on demand
    assert h.capacity >= 1_500_001 and h.count[1_500_000] == 1


def test_input_errors():
    h = PromptHistory()
    with pytest.raises(ValueError, match=r"\(2, G\)"):
        h.update([0, 1], torch.ones(3, 4), 0)
    with pytest.raises(ValueError, match=">= 0"):
        h.update([-1], torch.ones(1, 4), 0)
    with pytest.raises(AttributeError):
        h.missing  # noqa: B018
    view = h.count
    with pytest.raises(ValueError):
        view[0] = 5  # read-only views


def test_an_unseen_prompt_takes_the_mean_seen_score():
    h = PromptHistory(capacity=8)
    assert h.mean_seen_score(4) == 1.0  # nothing seen yet: every prompt alike
    h.update([3], torch.tensor([[1.0, 0.0, 1.0, 1.0]]), step=1)  # score 64/81 (hand-derived above)
    h.update([5], torch.ones(1, 4), step=1)  # p_hat = 5/6: 1 - (5/6)^4 - (1/6)^4
    s5 = 1 - (5 / 6) ** 4 - (1 / 6) ** 4
    assert h.mean_seen_score(4) == pytest.approx((64 / 81 + s5) / 2)
    assert torch.isinf(h.score([0])).all()  # the unseen prompt's own score still says "never seen"
    sig = h.signals([3, 5, 0], 4)
    assert sig.unseen.tolist() == [False, False, True]
    torch.testing.assert_close(
        sig.score, torch.tensor([64 / 81, s5, (64 / 81 + s5) / 2], dtype=torch.float64)
    )


def _history():
    rng = np.random.default_rng(1)
    h = PromptHistory()
    for step in range(3):
        idx = rng.integers(0, 40, 12)
        h.update(idx, torch.from_numpy((rng.random((12, 4)) < 0.4).astype(np.float64)), step)
    return h


def test_a_resumed_history_draws_what_the_uninterrupted_one_draws():
    h = _history()
    buf = io.BytesIO()
    torch.save(h.state_dict(), buf)
    buf.seek(0)
    resumed = PromptHistory()
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    idx = torch.arange(40)
    a, b = (x.signals(idx, 4) for x in (h, resumed))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and a.unseen.any()
    for policy in ("proportional", "uniform"):
        da, _ = prune_prompts(a.score, 0.5, 0.1, step_generator(7, 3, 0), policy=policy)
        db, _ = prune_prompts(b.score, 0.5, 0.1, step_generator(7, 3, 0), policy=policy)
        assert torch.equal(da.mask, db.mask) and torch.equal(da.prob, db.prob)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_state_loads_and_its_costs_are_not_used(version):
    h = _history()
    extra = {"tokens": torch.ones(h.capacity)} if version > 1 else {}
    extra.update({"mixed": torch.zeros(h.capacity)} if version > 2 else {})
    old = PromptHistory()
    old.load_state_dict({**h.state_dict(), **extra, "version": version, "decay": 0.5, "prior": 1.0,
                         "reward_kind": "auto"})  # fmt: skip
    assert torch.equal(old.score(torch.arange(40), 4), h.score(torch.arange(40), 4))
    assert old.state_dict()["version"] == 4


def test_fixed_ignores_the_measured_share():
    c = PromptRateControl.from_config(DPPOConfig(prompt_rate_control="fixed", prompt_prune_rate=0.4))
    for u in (0.0, 0.9, 1.7):
        c.observe(u)
        assert c.rate() == 0.4
    assert c.share is None


def test_zero_share_starts_at_the_configured_rate_then_follows_the_moving_average_by_hand():
    cfg = DPPOConfig(prompt_rate_control="zero-share", prompt_prune_rate=0.3)
    c = PromptRateControl.from_config(cfg)
    assert c.cap == ZERO_SHARE_CAP == 0.7
    assert c.rate() == 0.3  # nothing measured yet
    c.observe(0.5)
    assert c.rate() == 0.5  # the first measurement is taken as it is
    c.observe(0.25)
    assert c.rate() == pytest.approx(0.8 * 0.5 + 0.2 * 0.25)  # 0.45
    c.observe(1.9)  # an HT share above 1: averaged as it is, not clipped
    assert c.share == pytest.approx(0.8 * 0.45 + 0.2 * 1.9)  # 0.74
    assert c.rate() == 0.7  # the cap
    c.observe(0.0)
    c.observe(0.0)
    assert c.rate() == pytest.approx(0.74 * 0.8**2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1])
def test_zero_share_refuses_a_share_that_is_not_a_finite_number_at_least_0(bad):
    c = PromptRateControl(mode="zero-share")
    with pytest.raises(ValueError, match="all-equal share must be a finite number >= 0"):
        c.observe(bad)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "pid"}, "unknown prompt rate control 'pid'; valid: fixed, zero-share"),
        ({"initial": 1.0}, r"initial must be a prune rate in \[0, 1\)"),
        ({"cap": -0.1}, r"cap must be a prune rate in \[0, 1\)"),
        ({"smoothing": 1.0}, r"smoothing must be in \[0, 1\)"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PromptRateControl(**kwargs)


def test_state_round_trips_through_torch_save_and_a_mode_change_is_refused(tmp_path):
    c = PromptRateControl(mode="zero-share", initial=0.2)
    c.observe(0.35)
    c.observe(0.55)
    torch.save(c.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    resumed = PromptRateControl(mode="zero-share", initial=0.2)
    resumed.load_state_dict(state)
    assert resumed.rate() == c.rate() == pytest.approx(0.8 * 0.35 + 0.2 * 0.55)
    with pytest.raises(ValueError, match="resume with the same --dppo.prompt_rate_control"):
        PromptRateControl(mode="fixed").load_state_dict(state)
    with pytest.raises(ValueError, match="unsupported PromptRateControl state version"):
        resumed.load_state_dict({**state, "version": 0})
