"""Keep probabilities: the exact budget, floors, monotonicity and infeasible budgets of EVERY registered
completion policy (the tests loop over ``COMPLETION_POLICIES``; each policy's hand-derived cases are in
``tests/core/policies/test_<module>.py``), the prompt level, the registry, and the exact solve against a
plain bisection reference over seeds."""

import importlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from openrlhf_dppo.core import (
    COMPLETION_POLICIES,
    PROMPT_POLICIES,
    DPPOConfig,
    PromptSignals,
    completion_keep_probs,
    prompt_keep_probs,
    prompt_policy_keep_probs,
    solve_clipped_scale,
)
from openrlhf_dppo.core import policies as core_policies
from openrlhf_dppo.core import prompt_policies as core_prompt_policies
from openrlhf_dppo.core.registry import Registry

A8 = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 0.1], dtype=torch.float64)


def test_budget_beyond_scored_items_lifts_zero_advantages():
    # A = [1, 2, 4, 0], budget 3.5: the three non-zero items saturate at 1 (lambda >= 1), the A == 0
    # item (floor 0.1, no score) takes the rest 0.5; budget 4 (keep_frac 1) keeps everything
    A = torch.tensor([1.0, 2.0, -4.0, 0.0], dtype=torch.float64)
    p, m = completion_keep_probs(A, 0.875, "proportional", 0.1)
    torch.testing.assert_close(p, torch.tensor([1, 1, 1, 0.5], dtype=torch.float64), rtol=0, atol=1e-12)
    assert m["dppo/completion_keep_infeasible"] == 0.0
    p, _ = completion_keep_probs(A, 1.0, "proportional", 0.1)
    assert torch.equal(p, torch.ones(4, dtype=torch.float64))
    # prompts: a score of 0 sits at q_min until the others are at 1; keep_frac 1 keeps every prompt
    q, _ = prompt_keep_probs(torch.tensor([0.0, 0.5, float("inf")], dtype=torch.float64), 1.0, 0.1)
    assert torch.equal(q, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("policy", COMPLETION_POLICIES.names())
def test_infeasible_budgets_are_reported(policy):
    # the floor alone (0.1 per item) exceeds the budget 0.05: every item at the floor, above target
    p, m = completion_keep_probs(A8, 0.05, policy, 0.1)
    assert torch.equal(p, torch.full((8,), 0.1, dtype=torch.float64))
    assert m["dppo/completion_keep_infeasible"] == 1.0
    assert m["dppo/completion_keep_frac_expected"] == pytest.approx(0.1)
    # allow_zero with one non-zero advantage and budget 2: it is kept surely, the rest p = 0, below target
    p, m = completion_keep_probs(torch.tensor([0.0, 0.0, 0.0, 1.0]), 0.5, policy, 0.1, allow_zero=True)
    assert torch.equal(p, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    assert m["dppo/completion_keep_infeasible"] == 1.0
    assert m["dppo/completion_keep_frac_expected"] == 0.25


@settings(max_examples=60, deadline=None)
@given(
    adv=st.lists(st.sampled_from([0.0, 0.25, -0.5, 1.0, -1.5, 3.0, 0.01]), min_size=1, max_size=40),
    keep=st.floats(0.05, 1.0),
    p_min=st.floats(0.01, 1.0),
    policy=st.sampled_from(COMPLETION_POLICIES.names()),
    allow_zero=st.booleans(),
)
def test_budget_floors_and_monotonicity(adv, keep, p_min, policy, allow_zero):
    A = torch.tensor(adv, dtype=torch.float64)
    p, m = completion_keep_probs(A, keep, policy, p_min, allow_zero)
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


@pytest.mark.parametrize("seed", range(6))
def test_weighted_solve_matches_a_weighted_bisection_reference(seed):
    # sum_i w_i clip(c s_i, lo_i, 1) = K (the sqrt prompt policy's cost budget): a plain bisection on c
    g = torch.Generator().manual_seed(100 + seed)
    N = 25
    s = torch.rand(N, generator=g, dtype=torch.float64) * 2
    lo = torch.rand(N, generator=g, dtype=torch.float64) * 0.2
    w = 0.5 + 5 * torch.rand(N, generator=g, dtype=torch.float64)
    budget = float((w * lo).sum() + torch.rand(1, generator=g) * (w * (1 - lo)).sum())

    def f(c):
        return float((w * torch.clamp(torch.maximum(c * s, lo), max=1.0)).sum())

    a, b = 0.0, float((1 / s).max())
    for _ in range(200):
        mid = (a + b) / 2
        a, b = (mid, b) if f(mid) < budget else (a, mid)
    ref = torch.clamp(torch.maximum((a + b) / 2 * s, lo), max=1.0)
    p, status = solve_clipped_scale(s[None], lo[None], torch.tensor([budget]), w[None])
    assert int(status) == 0 and float((w * p[0]).sum()) == pytest.approx(budget, rel=1e-12)
    torch.testing.assert_close(p[0], ref, rtol=0, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    keep=st.floats(0.05, 1.0),
    q_min=st.floats(0.01, 1.0),
    policy=st.sampled_from(PROMPT_POLICIES.names()),
    seed=st.integers(0, 10_000),
)
def test_every_prompt_policy_keeps_its_floor_pins_and_budget(n, keep, q_min, policy, seed):
    g = torch.Generator().manual_seed(seed)
    score, moment = (torch.rand(n, generator=g, dtype=torch.float64) for _ in range(2))
    cost = 1 + 99 * torch.rand(n, generator=g, dtype=torch.float64)
    pinned = torch.rand(n, generator=g) < 0.2
    valid = torch.rand(n, generator=g) < 0.9
    sig = PromptSignals(score, moment, cost, pinned, pinned)
    q, m = prompt_policy_keep_probs(sig, keep, policy, q_min, valid)
    assert torch.all(q[~valid] == 0) and torch.all(q[valid & pinned] == 1)
    assert torch.all(q[valid] >= q_min - 1e-12) and torch.all(q <= 1)
    if m["dppo/prompt_keep_infeasible"] == 0.0:  # the budget is met: a count, or the sqrt rule's cost
        spent, budget = (cost * q, cost * valid) if policy == "sqrt" else (q, valid.double())
        assert float(spent.sum()) == pytest.approx(keep * float(budget.sum()), rel=1e-9, abs=1e-9)
    rows, _ = prompt_policy_keep_probs(PromptSignals(*(x.expand(2, n) for x in sig)), keep, policy, q_min,
                                       valid.expand(2, n))  # fmt: skip
    assert torch.equal(rows[0], q) and torch.equal(rows[1], q)  # rows are independent problems


PROMPT_POLICY_DIR = Path(core_prompt_policies.__file__).parent


def test_every_prompt_policy_module_is_registered_with_help_and_has_its_own_test_file():
    modules = sorted(p.stem for p in PROMPT_POLICY_DIR.glob("*.py") if not p.name.startswith("_"))
    registered = [importlib.import_module(f"{core_prompt_policies.__name__}.{m}").NAME for m in modules]
    assert sorted(registered) == PROMPT_POLICIES.names() == ["proportional", "sqrt", "uniform"]
    help_text = DPPOConfig.__dataclass_fields__["prompt_policy"].metadata["help"]
    for m, name in zip(modules, registered):
        assert PROMPT_POLICIES.help(name), f"prompt policy {name!r} ({m}.py) has no HELP"
        assert f"{name} ({PROMPT_POLICIES.help(name)})" in help_text
        assert (Path(__file__).parent / "prompt_policies" / f"test_{m}.py").is_file(), (
            f"prompt policy {name!r} needs tests/core/prompt_policies/test_{m}.py"
        )
    with pytest.raises(ValueError, match="valid: proportional, sqrt, uniform"):
        prompt_policy_keep_probs(PromptSignals.of_scores(torch.ones(3)), 0.5, "cube")


def test_bad_prompt_signals_are_refused_with_the_signal_named():
    sig = PromptSignals.of_scores(torch.ones(3))
    with pytest.raises(ValueError, match="cost must be finite and > 0"):
        prompt_policy_keep_probs(sig._replace(cost=torch.tensor([1.0, 0.0, 1.0])), 0.5, "sqrt")
    with pytest.raises(ValueError, match="moment must be finite"):
        prompt_policy_keep_probs(sig._replace(moment=torch.tensor([1.0, float("inf"), 1.0])), 0.5, "sqrt")
    with pytest.raises(ValueError, match="share one shape"):
        prompt_policy_keep_probs(sig._replace(cost=torch.ones(4)), 0.5, "sqrt")


@pytest.mark.parametrize("policy", COMPLETION_POLICIES.names())
def test_rows_are_independent_problems(policy):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 16, generator=g)
    valid = torch.rand(4, 16, generator=g) > 0.3
    p, _ = completion_keep_probs(A, 0.4, policy, 0.1, valid=valid)
    for r in range(4):
        pr, _ = completion_keep_probs(A[r][valid[r]], 0.4, policy, 0.1)
        torch.testing.assert_close(p[r][valid[r]], pr, rtol=0, atol=1e-12)
        assert torch.all(p[r][~valid[r]] == 0)


def test_prompt_keep_probs_hand():
    # scores [inf, 0, 0.5, 1, 0.2], keep 0.6 -> budget 3: the unseen prompt takes q = 1, the zero score
    # sits at q_min 0.1; with 1 saturated: 0.1 + 0.5c + 1 + 0.2c = 2 -> c = 9/7 -> q = [.., 9/14, 1, 9/35]
    q, m = prompt_keep_probs(torch.tensor([float("inf"), 0.0, 0.5, 1.0, 0.2], dtype=torch.float64), 0.6, 0.1)
    want = torch.tensor([1.0, 0.1, 9 / 14, 1.0, 9 / 35], dtype=torch.float64)
    torch.testing.assert_close(q, want, rtol=0, atol=1e-12)
    assert m["dppo/prompt_unseen_frac"] == pytest.approx(0.2)
    assert m["dppo/prompt_keep_infeasible"] == 0.0
    # all unseen: every prompt kept regardless of the budget (reported as infeasible)
    q, m = prompt_keep_probs(torch.full((4,), float("inf")), 0.5, 0.1)
    assert torch.equal(q, torch.ones(4, dtype=torch.float64)) and m["dppo/prompt_keep_infeasible"] == 1.0


def test_input_errors():
    with pytest.raises(ValueError, match="p_min"):
        completion_keep_probs(A8, 0.5, "proportional", 0.0)
    with pytest.raises(ValueError, match="keep_frac"):
        completion_keep_probs(A8, 0.0, "proportional", 0.1)
    with pytest.raises(ValueError, match="finite"):
        completion_keep_probs(torch.tensor([float("nan"), 1.0]), 0.5)
    with pytest.raises(ValueError, match=">= 0"):
        prompt_keep_probs(torch.tensor([-1.0, 1.0]), 0.5)


def test_registry_refuses_duplicates_and_lists_valid_names():
    assert {"proportional", "uniform-low"} <= set(COMPLETION_POLICIES.names())
    with pytest.raises(ValueError, match="already registered"):
        COMPLETION_POLICIES.register("proportional")(lambda *a: None)
    with pytest.raises(ValueError, match=r"valid: (.*, )?proportional, (.*, )?uniform-low"):
        completion_keep_probs(A8, 0.5, "no-such-policy")
    reg = Registry("thing")
    reg.register("a", help="the length")(len)
    assert reg.get("a") is len and "a" in reg and len(reg) == 1
    reg.declare("b", provider="some.module")
    assert reg.describe() == "a (the length); b" and reg.names() == ["a", "b"]
    with pytest.raises(ValueError, match="unknown thing 'c'; valid: a, b"):
        reg.help("c")


POLICY_DIR = Path(core_policies.__file__).parent
POLICY_TESTS = Path(__file__).parent / "policies"


def test_every_policy_module_is_registered_with_help_and_has_its_own_test_file():
    modules = sorted(p.stem for p in POLICY_DIR.glob("*.py") if not p.name.startswith("_"))
    registered = [importlib.import_module(f"{core_policies.__name__}.{m}").NAME for m in modules]
    assert sorted(registered) == COMPLETION_POLICIES.names()
    for m, name in zip(modules, registered):
        assert COMPLETION_POLICIES.help(name), f"policy {name!r} ({m}.py) has no HELP"
        assert (POLICY_TESTS / f"test_{m}.py").is_file(), (
            f"policy {name!r} needs tests/core/policies/test_{m}.py"
        )


def test_every_policy_is_in_the_flag_help():
    help_text = DPPOConfig.__dataclass_fields__["completion_policy"].metadata["help"]
    for name in COMPLETION_POLICIES.names():
        assert f"{name} ({COMPLETION_POLICIES.help(name)})" in help_text


def test_unseen_prompts_can_take_a_score_and_be_drawn_at_the_target_rate():
    # --dppo.unseen_prompts mean: every prompt unseen (the first step) -> all share one score and the
    # expected kept fraction is the target, where the default rule keeps them all
    allnew = torch.full((10,), float("inf"), dtype=torch.float64)
    q_keep, m_keep = prompt_keep_probs(allnew, 0.5, 0.1)
    assert torch.equal(q_keep, torch.ones(10, dtype=torch.float64))
    assert m_keep["dppo/prompt_keep_infeasible"] == 1.0
    q, m = prompt_keep_probs(allnew, 0.5, 0.1, unseen_score=1.0)
    assert torch.allclose(q, torch.full((10,), 0.5, dtype=torch.float64))
    assert m["dppo/prompt_keep_infeasible"] == 0.0 and m["dppo/prompt_unseen_frac"] == 1.0
    # mixed: the unseen prompt is scaled like a seen prompt of the same score
    s = torch.tensor([0.2, 0.4, float("inf"), 0.4], dtype=torch.float64)
    q, m = prompt_keep_probs(s, 0.5, 0.1, unseen_score=0.4)
    assert float(q[2]) == pytest.approx(float(q[1])) and float(q.sum()) == pytest.approx(2.0)
    assert m["dppo/prompt_unseen_frac"] == 0.25
    for bad in (float("inf"), float("nan"), -0.1):
        with pytest.raises(ValueError, match="unseen_score"):
            prompt_keep_probs(s, 0.5, 0.1, unseen_score=bad)
