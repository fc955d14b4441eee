"""Keep probabilities: the completion level's uniform-low rule (hand-derived cases, budget, floors,
monotonicity, infeasible budgets), the prompt policies, the registry, and the exact solve against a plain
bisection reference over seeds."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from openrlhf_dppo.core import (
    PROMPT_POLICIES,
    DPPOConfig,
    Registry,
    completion_keep_probs,
    prompt_keep_probs,
    solve_clipped_scale,
)

A8 = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 0.1], dtype=torch.float64)


def test_uniform_low_hand():
    # mean |A| = 5.1 / 8 = 0.6375: low set {0, 0, 0.5, -0.5, 0.1} (5 items), high {1, -1, 2} keep p = 1.
    # budget 0.5 * 8 = 4 -> low items share p = (4 - 3) / 5 = 0.2 (>= p_min 0.1)
    p, m = completion_keep_probs(A8, 0.5, 0.1)
    want = torch.tensor([0.2, 0.2, 1, 1, 0.2, 0.2, 1, 0.2], dtype=torch.float64)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)
    assert m["dppo/completion_keep_frac_expected"] == pytest.approx(0.5, abs=1e-12)
    assert m["dppo/completion_keep_infeasible"] == 0.0
    assert m["dppo/completion_zero_adv_frac"] == 0.25
    # allow_zero: the two A == 0 items get p = 0 and leave the budget to the 3 other low items: 1/3 each
    p, _ = completion_keep_probs(A8, 0.5, 0.1, allow_zero=True)
    t = 1 / 3
    want = torch.tensor([0, 0, 1, 1, t, t, 1, t], dtype=torch.float64)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)
    # keep_frac 1 keeps everything
    assert torch.equal(completion_keep_probs(A8, 1.0, 0.1)[0], torch.ones(8, dtype=torch.float64))


def test_uniform_low_spills_to_high_set_when_low_set_hits_floor():
    # A = [0.1, 0.1, 1, 1], mean |A| = 0.55 -> low {0.1, 0.1}. keep 0.3 -> budget 1.2 < 2 + 2 * 0.1:
    # low items sit at p_min = 0.1 and the high items share the rest: (1.2 - 0.2) / 2 = 0.5
    p, _ = completion_keep_probs(torch.tensor([0.1, 0.1, 1.0, 1.0]), 0.3, 0.1)
    torch.testing.assert_close(p, torch.tensor([0.1, 0.1, 0.5, 0.5], dtype=torch.float64), rtol=0, atol=1e-12)


def test_infeasible_budgets_are_reported():
    # the floor alone (0.1 per item) exceeds the budget 0.05: every item at the floor, above target
    p, m = completion_keep_probs(A8, 0.05, 0.1)
    assert torch.equal(p, torch.full((8,), 0.1, dtype=torch.float64))
    assert m["dppo/completion_keep_infeasible"] == 1.0
    assert m["dppo/completion_keep_frac_expected"] == pytest.approx(0.1)
    # allow_zero with one non-zero advantage and budget 2: it is kept surely, the rest p = 0, below target
    p, m = completion_keep_probs(torch.tensor([0.0, 0.0, 0.0, 1.0]), 0.5, 0.1, allow_zero=True)
    assert torch.equal(p, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    assert m["dppo/completion_keep_infeasible"] == 1.0
    assert m["dppo/completion_keep_frac_expected"] == 0.25


@settings(max_examples=60, deadline=None)
@given(
    adv=st.lists(st.sampled_from([0.0, 0.25, -0.5, 1.0, -1.5, 3.0, 0.01]), min_size=1, max_size=40),
    keep=st.floats(0.05, 1.0),
    p_min=st.floats(0.01, 1.0),
    allow_zero=st.booleans(),
)
def test_budget_floors_and_monotonicity(adv, keep, p_min, allow_zero):
    A = torch.tensor(adv, dtype=torch.float64)
    p, m = completion_keep_probs(A, keep, p_min, allow_zero)
    zero = (A == 0) & allow_zero
    assert torch.all(p[zero] == 0)
    assert torch.all(p[~zero] >= p_min - 1e-12) and torch.all(p <= 1)
    if m["dppo/completion_keep_infeasible"] == 0.0:
        assert abs(float(p.sum()) - keep * len(adv)) < 1e-9
    # larger |A| never gets a smaller keep probability (among items that may be kept)
    order = A.abs()[~zero].argsort()
    assert torch.all(p[~zero][order].diff() >= -1e-12)


def _bisect_reference(s, lo, budget, iters=200):
    # plain bisection on c for sum_i clip(c * s_i, lo_i, 1) = budget, one row, Python-level loop
    def f(c):
        return sum(min(max(c * a, b), 1.0) if a > 0 else b for a, b in zip(s, lo))

    hi = max([1.0 / a for a in s if a > 0], default=0.0)
    floor_only = [a == 0 and b > 0 for a, b in zip(s, lo)]
    if budget > f(hi) + 1e-12 and any(floor_only):
        # documented second tier: scored items at 1, the floor-only items share the rest
        inner = _bisect_reference(
            [1.0 if fo else 0.0 for fo in floor_only],
            [b if fo else 0.0 for fo, b in zip(floor_only, lo)],
            budget - sum(a > 0 for a in s),
            iters,
        )
        return [x if fo else (1.0 if a > 0 else b) for x, fo, a, b in zip(inner, floor_only, s, lo)]
    if budget <= f(0.0):
        c = 0.0
    elif budget >= f(hi):
        c = hi
    else:
        a, b = 0.0, hi
        for _ in range(iters):
            mid = (a + b) / 2
            a, b = (mid, b) if f(mid) < budget else (a, mid)
        c = (a + b) / 2
    return [min(max(c * x, y), 1.0) if x > 0 else y for x, y in zip(s, lo)]


@pytest.mark.parametrize("seed", range(8))
def test_exact_solve_matches_bisection_reference(seed):
    g = torch.Generator().manual_seed(seed)
    R, N = 5, 30
    s = torch.rand(R, N, generator=g, dtype=torch.float64) * 3
    s[s < 0.6] = 0.0  # some items with no score
    lo = torch.rand(R, N, generator=g, dtype=torch.float64) * 0.3
    budget = torch.rand(R, generator=g, dtype=torch.float64) * N
    p, status = solve_clipped_scale(s, lo, budget)
    for r in range(R):
        ref = torch.tensor(
            _bisect_reference(s[r].tolist(), lo[r].tolist(), float(budget[r])), dtype=torch.float64
        )
        torch.testing.assert_close(p[r], ref, rtol=0, atol=1e-9)
        if status[r] == 0:
            assert abs(float(p[r].sum() - budget[r])) < 1e-9


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    keep=st.floats(0.05, 1.0),
    q_min=st.floats(0.01, 1.0),
    policy=st.sampled_from(PROMPT_POLICIES.names()),
    seed=st.integers(0, 10_000),
)
def test_every_prompt_policy_keeps_its_floor_and_budget(n, keep, q_min, policy, seed):
    g = torch.Generator().manual_seed(seed)
    score = torch.rand(n, generator=g, dtype=torch.float64)
    valid = torch.rand(n, generator=g) < 0.9
    q, m = prompt_keep_probs(score, keep, q_min, policy, valid)
    assert torch.all(q[~valid] == 0)
    assert torch.all(q[valid] >= q_min - 1e-12) and torch.all(q <= 1)
    if m["dppo/prompt_keep_infeasible"] == 0.0:  # the budget is met: an expected count
        assert float(q.sum()) == pytest.approx(keep * float(valid.sum()), rel=1e-9, abs=1e-9)
    rows, _ = prompt_keep_probs(score.expand(2, n), keep, q_min, policy, valid.expand(2, n))
    assert torch.equal(rows[0], q) and torch.equal(rows[1], q)  # rows are independent problems


def test_proportional_prompt_policy_hand():
    # scores [0, 0.5, 1, 0.2], keep 0.5 -> budget 2 prompts: the zero score at q_min 0.1; with 1 saturated:
    # 0.1 + 0.5c + 1 + 0.2c = 2 -> c = 9/7 -> q = [0.1, 9/14, 1, 9/35]
    s = torch.tensor([0.0, 0.5, 1.0, 0.2], dtype=torch.float64)
    unseen = torch.tensor([False, False, False, True])
    q, m = prompt_keep_probs(s, 0.5, 0.1, unseen=unseen)
    want = torch.tensor([0.1, 9 / 14, 1.0, 9 / 35], dtype=torch.float64)
    torch.testing.assert_close(q, want, rtol=0, atol=1e-12)
    assert m["dppo/prompt_unseen_frac"] == pytest.approx(0.25) and m["dppo/prompt_keep_infeasible"] == 0.0
    # keep_frac 1 keeps every prompt
    assert torch.equal(prompt_keep_probs(s, 1.0, 0.1)[0], torch.ones(4, dtype=torch.float64))


def test_uniform_prompt_policy_keeps_every_prompt_at_the_keep_fraction():
    q, m = prompt_keep_probs(torch.tensor([0.0, 0.9, 0.1, 0.5]), 0.5, 0.1, "uniform")
    assert (
        torch.equal(q, torch.full((4,), 0.5, dtype=torch.float64)) and m["dppo/prompt_keep_infeasible"] == 0
    )


def test_rows_are_independent_problems():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 16, generator=g)
    valid = torch.rand(4, 16, generator=g) > 0.3
    p, _ = completion_keep_probs(A, 0.4, 0.1, valid=valid)
    for r in range(4):
        pr, _ = completion_keep_probs(A[r][valid[r]], 0.4, 0.1)
        torch.testing.assert_close(p[r][valid[r]], pr, rtol=0, atol=1e-12)
        assert torch.all(p[r][~valid[r]] == 0)


def test_input_errors():
    with pytest.raises(ValueError, match="p_min"):
        completion_keep_probs(A8, 0.5, 0.0)
    with pytest.raises(ValueError, match="keep_frac"):
        completion_keep_probs(A8, 0.0, 0.1)
    with pytest.raises(ValueError, match="finite"):
        completion_keep_probs(torch.tensor([float("nan"), 1.0]), 0.5)
    with pytest.raises(ValueError, match="finite and >= 0"):
        prompt_keep_probs(torch.tensor([-1.0, 1.0]), 0.5)
    with pytest.raises(ValueError, match="finite and >= 0"):
        prompt_keep_probs(torch.tensor([float("inf"), 1.0]), 0.5)


def test_the_prompt_policy_choices_are_the_registry_and_unknown_names_are_refused():
    assert PROMPT_POLICIES.names() == ["proportional", "uniform"]
    assert DPPOConfig.__dataclass_fields__["prompt_policy"].metadata["choices"] is PROMPT_POLICIES
    with pytest.raises(ValueError, match="valid: proportional, uniform"):
        prompt_keep_probs(torch.ones(3), 0.5, policy="cube")
    with pytest.raises(ValueError, match="already registered"):
        PROMPT_POLICIES.register("uniform")(lambda *a: None)
    reg = Registry("thing")
    reg.register("a")(len)
    assert reg.get("a") is len and "a" in reg and len(reg) == 1 and list(reg) == ["a"]
    with pytest.raises(ValueError, match="unknown thing 'c'; valid: a"):
        reg.get("c")
