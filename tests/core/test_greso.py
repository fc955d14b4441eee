"""core/greso.py: GRESO's streaks, keep probabilities, shares and the adaptation of p_easy / p_hard."""

import pytest
import torch

from openrlhf_dppo.core.greso import (
    EASY_TARGET,
    HARD_TARGET,
    GresoController,
    GresoStreaks,
    greso_keep_probs,
    greso_shares,
    group_kinds,
)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_group_kinds_all_equal_at_the_top_or_bottom():
    easy, hard = group_kinds(_t([[1, 1, 1], [0, 0, 0], [1, 0, 1], [0.5, 0.5, 0.5], [0.98, 0.98, 0.98],
                                 [0.1, 0.1, 0.1], [0.12, 0.12, 0.12], [1, 1, 0.99]]))  # fmt: skip
    assert easy.tolist() == [True, False, False, False, True, False, False, False]
    assert hard.tolist() == [False, True, False, False, False, True, False, False]


def test_shares_among_the_rolled_out_groups():
    assert greso_shares(_t([[1, 1], [1, 1], [0, 0], [1, 0]])) == (0.5, 0.25)
    assert greso_shares(torch.zeros(0, 4)) == (0.0, 0.0)


def test_streaks_count_trailing_runs_and_reset():
    s = GresoStreaks(2)
    idx = torch.tensor([0, 3])  # index 3 grows the arrays
    s.update(idx, _t([[1, 1], [0, 0]]))
    s.update(idx, _t([[1, 1], [0, 0]]))
    ze, zh = s.streaks(torch.tensor([0, 3, 1]))
    assert ze.tolist() == [2, 0, 0] and zh.tolist() == [0, 2, 0]
    s.update(idx, _t([[0, 0], [1, 0]]))  # easy -> hard resets the easy run; a mixed group resets both
    ze, zh = s.streaks(idx)
    assert ze.tolist() == [0, 0] and zh.tolist() == [1, 0]
    assert s.seen(torch.tensor([0, 1, 3])).tolist() == [True, False, True]
    assert s.rollouts[torch.tensor([0, 3])].tolist() == [3, 3]
    # rows apply in order: the same prompt twice ends with its last group's run
    s.update(torch.tensor([5, 5, 5]), _t([[1, 1], [1, 1], [1, 1]]))
    assert s.streaks(torch.tensor([5]))[0].tolist() == [3]
    with pytest.raises(ValueError, match="indices"):
        s.update(torch.tensor([0]), _t([[1, 1], [1, 1]]))


def test_streaks_state_round_trip():
    s = GresoStreaks()
    s.update(torch.tensor([2, 4]), _t([[1, 1], [0, 0]]))
    t = GresoStreaks()
    t.load_state_dict(s.state_dict())
    assert t.capacity == 5 and torch.equal(t.z_easy, s.z_easy) and torch.equal(t.rollouts, s.rollouts)
    with pytest.raises(ValueError, match="version"):
        t.load_state_dict({**s.state_dict(), "version": 99})


def test_keep_probs_easy_first_floor_and_one_without_a_streak():
    ze = torch.tensor([0, 1, 3, 20, 0, 0, 2])
    zh = torch.tensor([0, 0, 0, 0, 1, 2, 5])  # the last: both set, easy first
    q = greso_keep_probs(ze, zh, 0.5, 0.8)
    assert q.dtype == torch.float64
    assert q.tolist() == pytest.approx([1.0, 0.5, 0.125, 0.01, 0.8, 0.64, 0.25], abs=1e-15)
    assert float(greso_keep_probs(torch.tensor([40]), torch.tensor([0]), 0.95, 0.5)) == 0.95**40


def test_controller_moves_toward_its_targets_exactly():
    c = GresoController()
    assert (c.p_easy, c.p_hard) == (0.5, 0.5)
    # (easy share, hard share): at or above the target -> decrease; below -> increase
    script = [(0.5, 0.5), (EASY_TARGET, HARD_TARGET), (0.0, 0.0), (0.05, 0.2), (0.09, 0.1)]
    expected = [(0.49, 0.49), (0.48, 0.48), (0.49, 0.49), (0.50, 0.48), (0.49, 0.49)]
    for shares, p in zip(script, expected):
        c.update(*shares)
        assert (c.p_easy, c.p_hard) == p
    assert c.updates == 5


def test_controller_clamps_and_round_trips():
    c = GresoController()
    for _ in range(100):
        c.update(1.0, 0.0)
    assert (c.p_easy, c.p_hard) == (0.05, 0.95)
    d = GresoController()
    d.load_state_dict(c.state_dict())
    assert (d.p_easy, d.p_hard, d.updates) == (0.05, 0.95, 100)
    with pytest.raises(ValueError, match="share"):
        c.update(1.5, 0.0)
