"""``uniform-low``: hand-derived cases (the generic budget, floor and unbiasedness tests loop over every
registered policy)."""

import pytest
import torch

from openrlhf_dppo.core import completion_keep_probs

A8 = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 0.1], dtype=torch.float64)


def test_uniform_low_hand():
    # mean |A| = 5.1 / 8 = 0.6375: low set {0, 0, 0.5, -0.5, 0.1} (5 items), high {1, -1, 2} keep p = 1.
    # budget 0.5 * 8 = 4 -> low items share p = (4 - 3) / 5 = 0.2 (>= p_min 0.1)
    p, m = completion_keep_probs(A8, 0.5, "uniform-low", 0.1)
    want = torch.tensor([0.2, 0.2, 1, 1, 0.2, 0.2, 1, 0.2], dtype=torch.float64)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)
    assert m["dppo/completion_keep_frac_expected"] == pytest.approx(0.5, abs=1e-12)
    assert m["dppo/completion_keep_infeasible"] == 0.0
    assert m["dppo/completion_zero_adv_frac"] == 0.25
    # allow_zero: the two A == 0 items get p = 0 and leave the budget to the 3 other low items: 1/3 each
    p, _ = completion_keep_probs(A8, 0.5, "uniform-low", 0.1, allow_zero=True)
    t = 1 / 3
    want = torch.tensor([0, 0, 1, 1, t, t, 1, t], dtype=torch.float64)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)


def test_uniform_low_spills_to_high_set_when_low_set_hits_floor():
    # A = [0.1, 0.1, 1, 1], mean |A| = 0.55 -> low {0.1, 0.1}. keep 0.3 -> budget 1.2 < 2 + 2 * 0.1:
    # low items sit at p_min = 0.1 and the high items share the rest: (1.2 - 0.2) / 2 = 0.5
    p, _ = completion_keep_probs(torch.tensor([0.1, 0.1, 1.0, 1.0]), 0.3, "uniform-low", 0.1)
    torch.testing.assert_close(p, torch.tensor([0.1, 0.1, 0.5, 0.5], dtype=torch.float64), rtol=0, atol=1e-12)
