"""``proportional`` prompt policy: q = clip(c s, q_min, 1) at an expected kept count, hand-derived."""

import pytest
import torch

from openrlhf_dppo.core import PromptSignals, prompt_keep_probs, prompt_policy_keep_probs


def test_hand_case_and_it_is_the_scores_only_rule():
    # scores [unseen, 0, 0.5, 1, 0.2], keep 0.6 -> budget 3 prompts: the pinned unseen prompt q = 1, the
    # zero score at q_min 0.1; with 1 saturated: 0.1 + 0.5c + 1 + 0.2c = 2 -> c = 9/7 -> 9/14 and 9/35.
    # E[v] and the costs play no part (both set to nonsense here)
    s = torch.tensor([0.0, 0.0, 0.5, 1.0, 0.2], dtype=torch.float64)
    pinned = torch.tensor([True, False, False, False, False])
    sig = PromptSignals(s, torch.rand(5, dtype=torch.float64), torch.arange(1.0, 6.0, dtype=torch.float64),
                        pinned, pinned)  # fmt: skip
    q, m = prompt_policy_keep_probs(sig, 0.6, "proportional", 0.1)
    want = torch.tensor([1.0, 0.1, 9 / 14, 1.0, 9 / 35], dtype=torch.float64)
    torch.testing.assert_close(q, want, rtol=0, atol=1e-12)
    assert m["dppo/prompt_unseen_frac"] == pytest.approx(0.2)
    old, _ = prompt_keep_probs(
        torch.tensor([float("inf"), 0.0, 0.5, 1.0, 0.2], dtype=torch.float64), 0.6, 0.1
    )
    assert torch.equal(q, old)
