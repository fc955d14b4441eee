"""``uniform`` prompt policy (the equal-cost control): q = keep_frac whatever the history, hand-derived."""

import torch

from openrlhf_dppo.core import PromptSignals, prompt_policy_keep_probs


def _sig(score, pinned):
    s = torch.tensor(score, dtype=torch.float64)
    p = torch.tensor(pinned)
    return PromptSignals(s, s.clone(), torch.tensor([1.0, 5.0, 2.0, 9.0], dtype=torch.float64), p, p)


def test_every_prompt_at_the_keep_fraction_and_pinned_ones_take_their_share():
    # nothing pinned: q = 0.5 for all, however the scores and costs differ
    q, m = prompt_policy_keep_probs(_sig([0.0, 0.9, 0.1, 0.5], [False] * 4), 0.5, "uniform", 0.1)
    assert (
        torch.equal(q, torch.full((4,), 0.5, dtype=torch.float64)) and m["dppo/prompt_keep_infeasible"] == 0
    )
    # one pinned prompt (unseen under keep): budget 2 prompts, it takes 1, the other three share 1 -> 1/3
    q, _ = prompt_policy_keep_probs(
        _sig([0.0, 0.9, 0.1, 0.5], [True, False, False, False]), 0.5, "uniform", 0.1
    )
    torch.testing.assert_close(
        q, torch.tensor([1.0, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64), rtol=0, atol=1e-12
    )
