"""``sqrt`` prompt policy: q = clip(lambda sqrt(E[v] / c), q_min, 1) at an expected cost keep_frac x the
batch's; a hand-derived case, and the property that makes it the rule: it minimises the prompt draw's
variance sum_j v_j (1 / q_j - 1) at that cost (no feasible perturbation does better)."""

import pytest
import torch

from openrlhf_dppo.core import PromptSignals, prompt_policy_keep_probs


def _sig(v, c, pinned=None):
    v = torch.as_tensor(v, dtype=torch.float64)
    p = torch.zeros_like(v, dtype=torch.bool) if pinned is None else torch.as_tensor(pinned)
    return PromptSignals(v.clone(), v, torch.as_tensor(c, dtype=torch.float64), p, p)


def test_hand_case():
    # v = [0.64, 0.16, 0.36], c = [1, 1, 4] -> x = sqrt(v / c) = [0.8, 0.4, 0.3]; keep 0.6 -> budget
    # 0.6 * 6 = 3.6 tokens. Unclipped: lambda (0.8 + 0.4 + 4 * 0.3) = 3.6 -> lambda = 1.5 puts prompt 0 at
    # 1.2 > 1, so it is clipped: 1 + lambda (0.4 + 1.2) = 3.6 -> lambda = 1.625 -> q = [1, 0.65, 0.4875]
    q, m = prompt_policy_keep_probs(_sig([0.64, 0.16, 0.36], [1.0, 1.0, 4.0]), 0.6, "sqrt", 0.1)
    torch.testing.assert_close(q, torch.tensor([1.0, 0.65, 0.4875], dtype=torch.float64), rtol=0, atol=1e-12)
    assert m["dppo/prompt_keep_infeasible"] == 0.0
    assert m["dppo/prompt_keep_frac_expected"] == pytest.approx(2.1375 / 3)  # the count follows the costs
    # a pinned prompt (unseen, keep) costs its c against the budget: [pinned c = 2, x = 0.5 c = 1, x = 0.5
    # c = 1], keep 0.5 -> budget 2: the pinned one spends 2, the others sit at the floor 0.1 (infeasible)
    q, m = prompt_policy_keep_probs(
        _sig([0.0, 0.25, 0.25], [2.0, 1.0, 1.0], [True, False, False]), 0.5, "sqrt", 0.1
    )
    torch.testing.assert_close(q, torch.tensor([1.0, 0.1, 0.1], dtype=torch.float64), rtol=0, atol=1e-12)
    assert m["dppo/prompt_keep_infeasible"] == 1.0


def test_equal_costs_make_it_the_square_root_of_the_proportional_rule():
    # c = 1 everywhere and E[v] = s: q ~ sqrt(s) where proportional gives q ~ s (no clipping at keep 0.3)
    s = torch.tensor([0.04, 0.09, 0.16, 0.25], dtype=torch.float64)
    q, _ = prompt_policy_keep_probs(_sig(s, torch.ones(4)), 0.3, "sqrt", 0.01)
    torch.testing.assert_close(q / q[0], torch.tensor([1.0, 1.5, 2.0, 2.5], dtype=torch.float64))


def _variance(v, q):
    return float((v * (1.0 / q - 1.0)).sum())


@pytest.mark.parametrize("seed", range(12))
def test_no_feasible_perturbation_at_equal_cost_lowers_the_variance(seed):
    g = torch.Generator().manual_seed(seed)
    B = 12
    v = torch.rand(B, generator=g, dtype=torch.float64) ** 2 + 1e-3
    c = 1.0 + 9.0 * torch.rand(B, generator=g, dtype=torch.float64)
    keep, q_min = 0.2 + 0.6 * float(torch.rand(1, generator=g)), 0.05
    q, m = prompt_policy_keep_probs(_sig(v, c), keep, "sqrt", q_min)
    assert m["dppo/prompt_keep_infeasible"] == 0.0
    assert float((c * q).sum()) == pytest.approx(keep * float(c.sum()), rel=1e-12)  # the cost budget
    best = _variance(v, q)
    for _ in range(400):  # move cost from one prompt to another: c_i dq_i = -c_k dq_k
        i, k = torch.randint(0, B, (2,), generator=g).tolist()
        if i == k:
            continue
        eps = float(torch.rand(1, generator=g)) * 0.05
        p = q.clone()
        p[i] += eps / c[i]
        p[k] -= eps / c[k]
        if float(p.min()) < q_min or float(p.max()) > 1.0:
            continue  # outside the feasible set
        assert float((c * p).sum()) == pytest.approx(float((c * q).sum()), rel=1e-12)
        assert _variance(v, p) >= best - 1e-12
    # and today's rule at the same cost (q ~ v / c rescaled) is worse whenever the costs or values differ
    prop, _ = prompt_policy_keep_probs(_sig(v / c * c.mean(), c), keep, "proportional", q_min)
    prop = prop * (keep * float(c.sum()) / float((c * prop).sum()))
    if float(prop.max()) <= 1.0 and float(prop.min()) >= q_min:
        assert _variance(v, prop) > best
