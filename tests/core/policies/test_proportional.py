"""``proportional``: hand-derived cases (the generic budget, floor and unbiasedness tests loop over
every registered policy)."""

import torch

from openrlhf_dppo.core import completion_keep_probs


def test_proportional_hand():
    # A = [1, 2, 4, 0], budget 2, p_min 0.1: the 0 sits at 0.1; 4 * lambda >= 1 saturates;
    # lambda * 1 + lambda * 2 + 1 + 0.1 = 2 -> lambda = 0.3 -> p = [0.3, 0.6, 1, 0.1]
    p, _ = completion_keep_probs(torch.tensor([1.0, 2.0, -4.0, 0.0]), 0.5, "proportional", 0.1)
    torch.testing.assert_close(p, torch.tensor([0.3, 0.6, 1.0, 0.1], dtype=torch.float64), rtol=0, atol=1e-12)
    # floor binding: A = [1, 100], budget 1, p_min 0.4 -> 0.4 + 100 * lambda = 1 -> p = [0.4, 0.6]
    p, _ = completion_keep_probs(torch.tensor([1.0, 100.0]), 0.5, "proportional", 0.4)
    torch.testing.assert_close(p, torch.tensor([0.4, 0.6], dtype=torch.float64), rtol=0, atol=1e-12)
