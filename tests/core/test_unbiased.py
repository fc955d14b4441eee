"""Monte-Carlo unbiasedness of the pruned-and-reweighted GRPO gradient (METHOD.md, conditions 1-2).

The toy (``dppo_mc_sim.py``): a softmax policy whose per-completion gradients are closed-form. For every
configuration we draw R fresh rollouts, compute the exact full-batch gradient g of each and the pruned
estimate g_hat on the same rollouts, and test the paired difference: every coordinate of
mean(g_hat - g) must lie within 4 standard errors of 0, while the negative control (the same weighted
sum divided by the KEPT count instead of B * G) must be off by more than 4 standard errors.
Seeds are fixed per configuration, so the test is deterministic.
"""

import sys
import zlib
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dppo_mc_sim import Toy, simulate  # noqa: E402

from openrlhf_dppo.core import (  # noqa: E402
    PROMPT_POLICIES,
    PromptRateControl,
    prompt_keep_probs,
    prune_prompts,
    sample_mask,
)

R = 10000
R_HIGH = 40000  # both levels at rate 0.9 keep ~2% of the items: the control needs more replicates
RATES = (0.3, 0.5, 0.7, 0.9)
# the prompt level under every prompt policy (reading the toy's history: one prompt unseen, scored as the
# mean seen one), the completion level and both levels together (systematic draws throughout)
CONFIGS = [("prompt", pol, r) for pol in PROMPT_POLICIES.names() for r in RATES] + [
    (lvl, "uniform-low", r) for lvl in ("completion", "both") for r in RATES
]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


@pytest.fixture(scope="module")
def toy():
    return Toy()


@pytest.mark.parametrize("level,policy,rate", CONFIGS)
def test_unbiased_and_kept_count_control_detected(toy, level, policy, rate):
    # the completion draws also exercise the multiple_of rescale (dp_size 2): weights use p_used
    n = R_HIGH if (level, rate) == ("both", 0.9) else R
    if level == "prompt":
        res = simulate(toy, n, level, rate, seed=_seed(level, policy, rate), prompt_policy=policy,
                       scores=toy.signals().score)  # fmt: skip
    else:
        res = simulate(toy, n, level, rate, multiple_of=2, seed=_seed(level, policy, "systematic", rate))
    assert res.z.abs().max() < 4.0, f"bias detected: z = {res.z.tolist()}"
    assert res.z_kept_count.abs().max() > 4.0, f"kept-count normaliser not detected: {res.z_kept_count}"
    # Var(g_hat) = Var(g) + E[Var(g_hat | rollouts)] >= Var(g); allow Monte-Carlo noise on the ratio
    assert res.var_ratio > 0.95


@pytest.mark.parametrize("level,policy,rate", [
    (lvl, pol, r) for lvl in ("prompt", "both") for pol in PROMPT_POLICIES.names() for r in (0.5, 0.9)
])  # fmt: skip
def test_unseen_prompts_drawn_at_the_mean_score_stay_unbiased(toy, level, policy, rate):
    # the unseen prompt takes the mean score of the seen ones, so it can be pruned (q < 1)
    sig = toy.signals()
    q, _ = prompt_keep_probs(sig.score, 1.0 - rate, 0.05, policy)
    assert bool(sig.unseen[0]) and not sig.unseen[1:].any() and float(q[0]) < 1.0
    n = R_HIGH if (level, rate) == ("both", 0.9) else R
    res = simulate(toy, n, level, rate, multiple_of=2, seed=_seed("unseen", level, policy, rate),
                   prompt_policy=policy, scores=sig.score)  # fmt: skip
    assert res.z.abs().max() < 4.0, f"bias detected: z = {res.z.tolist()}"
    assert res.z_kept_count.abs().max() > 4.0, f"kept-count normaliser not detected: {res.z_kept_count}"


@pytest.mark.parametrize("policy", PROMPT_POLICIES.names())
def test_a_prompt_policy_fed_the_steps_own_rewards_is_detected_as_biased(policy):
    """Leakage control. The draw uses q from the history BEFORE the step (unbiased); the control weights
    the same draw by 1 / q' with q' computed by the same policy from a history that has already learned
    the step's own rewards (what a trainer that re-scores after ``update``, or a replay whose score saw
    the rollout, would do). A mixed group raises its own score, so q' > q exactly where there is gradient
    and the estimate shrinks: the test must see it. (Drawing AND weighting with q' would be a
    Horvitz-Thompson estimate with outcome-dependent but known probabilities, unbiased in this toy; in a
    run the draw comes before the rollout, so the leak shows as weights that do not match the draw.)
    ``uniform`` reads no history: its q' equals q, checked instead."""
    toy, n = Toy(seed=3, unseen=False), 6000
    gen = torch.Generator().manual_seed(_seed("leak", policy))
    adv, grads, rewards = toy.rollouts(n, gen, with_rewards=True)
    per_prompt = grads.sum(dim=2)  # (n, B, K)
    full = per_prompt.sum(dim=1) / (toy.B * toy.G)
    past = toy.history(copies=n)  # one history per replicate, the same past in each
    index = torch.arange(n * toy.B)
    before = past.signals(index, toy.G).score.reshape(n, toy.B)
    q, _ = prompt_keep_probs(before, 0.5, 0.05, policy)
    mask, q_used = sample_mask(q, gen)
    honest = (torch.where(mask, 1.0 / q_used, 0.0)[..., None] * per_prompt).sum(dim=1) / (toy.B * toy.G)
    past.update(index, rewards.reshape(n * toy.B, toy.G), 99)  # the step's own rewards
    after = past.signals(index, toy.G).score.reshape(n, toy.B)
    q_leak, _ = prompt_keep_probs(after, 0.5, 0.05, policy)
    leaky = (torch.where(mask, 1.0 / q_leak, 0.0)[..., None] * per_prompt).sum(dim=1) / (toy.B * toy.G)

    def z(d):
        return d.mean(0) / (d.std(dim=0) / n**0.5)

    assert z(honest - full).abs().max() < 4.0, f"bias detected: z = {z(honest - full).tolist()}"
    if policy == "uniform":
        assert torch.equal(q_leak, q)
    else:
        assert z(leaky - full).abs().max() > 4.0, f"leakage not detected: z = {z(leaky - full).tolist()}"


def test_zero_advantage_drop_needs_no_kl_term():
    # with a KL/entropy-like term (beta != 0) a completion with A == 0 still has a gradient: giving it
    # p = 0 (allow_zero) is biased and must be detected; keeping the floor p_min is unbiased
    toy = Toy(beta=0.5)
    ok = simulate(toy, R, "completion", 0.5, allow_zero=False, seed=11)
    bad = simulate(toy, R, "completion", 0.5, allow_zero=True, seed=11)
    assert ok.z.abs().max() < 4.0
    assert bad.z.abs().max() > 4.0


def test_variance_inflation_grows_with_rate(toy):
    # reported next to 1/(1-r) in benchmarks/RESULTS.md; here only its direction is checked
    ratios = [simulate(toy, R, "completion", r, seed=_seed("var", r)).var_ratio for r in RATES]
    assert all(a < b for a, b in zip(ratios, ratios[1:])), ratios
    assert ratios[0] < 1.0 / (1.0 - RATES[0])


def test_harness_sees_exact_gradient(toy):
    # sanity of the harness itself: rate 0 without the A == 0 drop keeps everything, so g_hat == g
    gen = torch.Generator().manual_seed(0)
    adv, grads = toy.rollouts(3, gen)
    res = simulate(toy, 200, "completion", 0.0, allow_zero=False, seed=3)
    assert res.diff_mean.abs().max() < 1e-15 and res.keep_frac == 1.0
    # with the drop, zero-advantage completions (all-equal groups) are skipped at no bias
    res = simulate(toy, 200, "completion", 0.0, allow_zero=True, seed=3)
    assert res.diff_mean.abs().max() < 1e-15 and res.keep_frac < 1.0
    assert grads.shape == (3, toy.B, toy.G, toy.K) and adv.shape == (3, toy.B, toy.G)


def _prompt_level_steps(toy: Toy, R: int, draw, seed: int):
    """R steps of the prompt level as OpenRLHF's loop runs them: a draw that keeps no prompt yields no
    rollouts, and the loop asks for another draw for the same step. draw(gen) -> (mask, weight) (B,).
    Returns (g_hat - g over the steps (R, K), number of draws that kept nothing)."""
    gen = torch.Generator().manual_seed(seed)
    adv, grads = toy.rollouts(R, gen)
    per_prompt = grads.sum(dim=2)  # (R, B, K)
    full = per_prompt.sum(dim=1) / (toy.B * toy.G)
    est, empty = torch.empty_like(full), 0
    for r in range(R):
        mask, weight = draw(gen)
        while not mask.any():
            empty += 1
            mask, weight = draw(gen)
        est[r] = weight @ per_prompt[r] / (toy.B * toy.G)
    return est - full, empty


def test_a_prompt_draw_never_keeps_nothing_and_the_step_stays_unbiased():
    # 3 prompts, keep 30%: an independent (Bernoulli) draw keeps nothing with probability ~0.35.
    # prune_prompts (what the samples generator calls) must never leave the step empty, and its
    # weights must stay unbiased for the full batch.
    toy = Toy(B=3, seed=2, unseen=False)
    keep, q_min = 0.3, 0.05

    def pruned(gen):
        d, _ = prune_prompts(toy.scores, keep, q_min, gen)
        return d.mask, d.weight

    d, empty = _prompt_level_steps(toy, 4000, pruned, _seed("empty", "systematic"))
    z = d.mean(0) / (d.std(dim=0) / len(d) ** 0.5)
    assert z.abs().max() < 4.0, f"bias detected: z = {z.tolist()} ({empty} draws kept nothing)"
    assert empty == 0, f"{empty} prompt draws kept nothing"

    # the control: Bernoulli weights 1/q with the loop's redraw is conditioned on a non-empty draw,
    # E[g_hat] = g / P(non-empty); the same test must see it
    q, _ = prompt_keep_probs(toy.scores, keep, q_min)
    assert float(torch.prod(1 - q)) > 0.2

    def conditioned(gen):
        mask = torch.rand(q.shape, generator=gen, dtype=torch.float64) < q
        return mask, torch.where(mask, 1.0 / q, 0.0)

    d, empty = _prompt_level_steps(toy, 4000, conditioned, _seed("empty", "control"))
    z = d.mean(0) / (d.std(dim=0) / len(d) ** 0.5)
    assert empty > 0 and z.abs().max() > 4.0, (
        f"conditioning on a non-empty draw not detected: z = {z.tolist()}"
    )


def _controlled_steps(toy: Toy, R: int, T: int, seed: int, weights_at_initial: bool = False):
    """R runs of T steps of the prompt level whose rate comes from ``PromptRateControl`` (zero-share):
    step t prunes at the moving average of the HT all-equal shares of steps < t, so its q depend on
    earlier rollouts. weights_at_initial: the control -- the draw uses the controlled q, the weights 1 / q
    at the first rate (a weight that does not match the draw's rate). Returns (g_hat - g per step
    (R * T, K), the rates used (R * T,))."""
    gen = torch.Generator().manual_seed(seed)
    diffs, rates = [], []
    z = toy.B * toy.G
    q0, _ = prompt_keep_probs(toy.scores, 0.8, 0.1)  # the control's weights: q at the first rate, 0.2
    for _ in range(R):
        ctl = PromptRateControl(mode="zero-share", initial=0.2, cap=0.8)
        adv, grads = toy.rollouts(T, gen)
        for t in range(T):
            rate = ctl.rate()
            d, _ = prune_prompts(toy.scores, 1.0 - rate, 0.1, gen)
            weight = d.weight
            if weights_at_initial:
                weight = torch.where(d.mask, 1.0 / q0, 0.0)
            per_prompt = grads[t].sum(dim=1)  # (B, K)
            diffs.append((weight @ per_prompt - per_prompt.sum(dim=0)) / z)
            rates.append(rate)
            equal = (adv[t] == 0).all(dim=1).double()  # all G rewards equal: every advantage 0
            ctl.observe(float((d.weight * equal).sum()) / toy.B)  # rollout/equal_reward_frac_ht
    return torch.stack(diffs), torch.tensor(rates)


def test_a_prune_rate_set_from_earlier_steps_by_the_zero_share_control_stays_unbiased():
    # --dppo.prompt_rate_control zero-share: the rate of a draw follows the measured share of groups
    # without gradient; it is fixed before the step's rollout, so the step's estimate stays unbiased
    toy = Toy(B=6, seed=4)
    d, rates = _controlled_steps(toy, 1500, 3, _seed("control", "systematic"))
    assert float(rates.std()) > 0.1 and float(rates.max()) > 0.5  # the rate really moves, above the start
    z = d.mean(0) / (d.std(dim=0) / len(d) ** 0.5)
    assert z.abs().max() < 4.0, f"bias detected: z = {z.tolist()}"
    # the control: weights at the first rate while the draw used the controlled one must be detected
    d, _ = _controlled_steps(toy, 1500, 3, _seed("control", "systematic"), weights_at_initial=True)
    z = d.mean(0) / (d.std(dim=0) / len(d) ** 0.5)
    assert z.abs().max() > 4.0, (
        f"weights that do not match the controlled rate not detected: z = {z.tolist()}"
    )


# ---- REINFORCE++-baseline: the exact part (given the batch statistics) and the ratio part ---------------


@pytest.mark.parametrize("rate", [0.5, 0.7])
def test_reinforce_baseline_is_unbiased_given_the_batch_token_statistics(toy, rate):
    from dppo_mc_sim import simulate_whitened

    res = simulate_whitened(toy, 4000, rate, seed=_seed("rb", rate))
    assert res.z.abs().max() < 4.0, f"bias detected: z = {res.z.tolist()}"
    assert res.z_kept_count.abs().max() > 4.0, f"kept-count normaliser not detected: {res.z_kept_count}"


def test_reinforce_baselines_estimated_token_statistics_are_consistent_and_the_unweighted_ones_are_not(toy):
    """m_hat and 1/s_hat are ratios of Horvitz-Thompson sums: biased for a small batch, but their error
    (bias and spread) falls as the batch grows (16x the prompts: 1/sqrt(16) = 1/4 asymptotically; about 0.2
    for m here); the kept tokens' plain mean (no 1/(q p)) stays off by the same amount (its bias does not
    fall): it is inconsistent. The gradient's error falls with them."""
    from dppo_mc_sim import simulate_whitened

    small = simulate_whitened(toy, 1500, 0.5, seed=_seed("rb-small"))
    large = simulate_whitened(toy, 1500, 0.5, seed=_seed("rb-large"), tile=16)

    def rms(x):
        return float(x.pow(2).mean().sqrt())

    assert rms(large.mean_err) < 0.4 * rms(small.mean_err)
    # 1/s_hat: a small kept set whose tokens share one return has s_hat ~ 0 (1/s_hat clamped at 1e4), so
    # its RMS is dominated by those draws; the median error falls from about 0.63 to 0.27 here
    assert float(large.rstd_err.abs().median()) < 0.6 * float(small.rstd_err.abs().median())
    assert rms(large.grad_err) < 0.5 * rms(small.grad_err)
    bias = float(large.mean_err_unweighted.mean())
    se = float(large.mean_err_unweighted.std()) / 1500**0.5
    assert abs(bias) > 4 * se and abs(bias) > 0.5 * abs(float(small.mean_err_unweighted.mean()))
    assert abs(float(large.mean_err.mean())) < 4 * float(large.mean_err.std()) / 1500**0.5 + 0.1 * abs(bias)


def test_rloo_is_unbiased_under_pruning():
    """RLOO's baseline is within the group, so it is computed on the full group and the pruned estimate
    stays unbiased; the kept-count normaliser is detected."""
    res = simulate(Toy(estimator="rloo"), R, "both", 0.5, multiple_of=2, seed=_seed("rloo", "systematic"))
    assert res.z.abs().max() < 4.0, f"bias detected: z = {res.z.tolist()}"
    assert res.z_kept_count.abs().max() > 4.0, f"kept-count normaliser not detected: {res.z_kept_count}"


# ---- the biased peer: CPPO's rule (--dppo.method cppo) --------------------------------------------------


def _cppo_vs_full(toy: Toy, R: int, rate: float, seed: int) -> torch.Tensor:
    """(R, K) g_cppo - g on the same rollouts: CPPO keeps the top |A| of each full group at weight 1 with
    the full group's advantages, and averages over the kept (normaliser: the kept count)."""
    from openrlhf_dppo.core.cppo import cppo_keep_mask

    gen = torch.Generator().manual_seed(seed)
    adv, grads = toy.rollouts(R, gen)
    full = grads.sum(dim=(1, 2)) / (toy.B * toy.G)
    mask = cppo_keep_mask(adv.reshape(R * toy.B, toy.G), rate).reshape(R, toy.B, toy.G)
    kept = mask.double()
    cppo = (kept[..., None] * grads).sum(dim=(1, 2)) / kept.sum(dim=(1, 2))[:, None]
    return cppo - full


def test_cppo_rule_is_biased_a_negative_control(toy):
    """CPPO is biased by design (no reweighting): on the toy of the unbiasedness tests its mean gradient is
    many standard errors from GRPO's full-batch gradient. At rate 0 it keeps every completion and equals
    GRPO exactly, so the test compares like with like and can fail."""
    exact = _cppo_vs_full(toy, 200, 0.0, _seed("cppo", 0.0))
    assert exact.abs().max() < 1e-12
    d = _cppo_vs_full(toy, 4000, 0.5, _seed("cppo", 0.5))
    z = d.mean(0) / (d.std(dim=0) / len(d) ** 0.5)
    assert z.abs().max() > 6.0, f"CPPO's bias not detected: z = {z.tolist()}"


# ---- the biased peer: GRESO's skip (--dppo.method greso) --------------------------------------------------


def _greso_vs_full(toy: Toy, R: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GRESO's pre-rollout skip on the toy. The prompts' earlier groups (scripted): prompt 2 (success rate
    0.83 on the default toy, its group all solved about half the time) was solved by its last 2 groups,
    prompt 4 (0.06) and prompt 3 (0.08) failed by their last 3 and 1; the others were mixed. Their streaks
    (``GresoStreaks``) give keep probabilities at p = 0.5 (``greso_keep_probs``): 0.25, 0.125, 0.5, 1 for
    the rest. Each replicate skips every prompt independently with probability 1 - keep. Returns the keep
    probabilities and, per replicate (R, K), g_greso - g (kept groups at weight 1, as GRESO trains them)
    and g_ht - g (the same draw, weights 1 / keep as DPPO's q), both over the full batch's B G."""
    from openrlhf_dppo.core.greso import GresoController, GresoStreaks, greso_keep_probs

    solved, failed, mixed = [1.0] * toy.G, [0.0] * toy.G, [1.0] + [0.0] * (toy.G - 1)
    past = [  # (rows of (prompt, group rewards)) per earlier step, oldest first
        [(0, mixed), (1, mixed), (2, mixed), (3, mixed), (4, failed), (5, mixed)],
        [(0, mixed), (1, mixed), (2, solved), (3, mixed), (4, failed), (5, mixed)],
        [(0, mixed), (1, mixed), (2, solved), (3, failed), (4, failed), (5, mixed)],
    ]
    streaks = GresoStreaks(toy.B)
    for rows in past:
        streaks.update(torch.tensor([j for j, _ in rows]), torch.tensor([r for _, r in rows]))
    ctl = GresoController()
    keep = greso_keep_probs(*streaks.streaks(torch.arange(toy.B)), ctl.p_easy, ctl.p_hard)
    gen = torch.Generator().manual_seed(seed)
    _, grads = toy.rollouts(R, gen)
    per_prompt = grads.sum(dim=2)  # (R, B, K)
    full = per_prompt.sum(dim=1) / (toy.B * toy.G)
    mask = torch.rand(R, toy.B, generator=gen, dtype=torch.float64) < keep
    greso = (mask.double()[..., None] * per_prompt).sum(dim=1) / (toy.B * toy.G)
    ht = (torch.where(mask, 1.0 / keep, 0.0)[..., None] * per_prompt).sum(dim=1) / (toy.B * toy.G)
    return keep, greso - full, ht - full


def test_greso_skip_is_biased_and_the_same_keep_probs_reweighted_are_not(toy):
    """GRESO is biased by design (no reweighting): skipping prompts on their all-solved / all-failed
    streaks also skips the groups of those prompts that would have been mixed and carried gradient, so the
    mean update is many standard errors from GRPO's full-batch gradient. The same keep probabilities used
    as DPPO's q, with weights 1 / q, are unbiased: the bias is the missing correction, not the draw."""
    keep, greso, ht = _greso_vs_full(toy, 20000, _seed("greso"))
    assert keep.tolist() == [1.0, 1.0, 0.25, 0.5, 0.125, 1.0]

    def z(d):
        return d.mean(0) / (d.std(dim=0) / len(d) ** 0.5)

    assert z(greso).abs().max() > 6.0, f"GRESO's bias not detected: z = {z(greso).tolist()}"
    assert z(ht).abs().max() < 4.0, f"bias detected in the reweighted skip: z = {z(ht).tolist()}"


def test_greso_skip_of_prompts_without_gradient_loses_nothing():
    """The control of the test above, where it must see no bias: GRESO's premise holds when the skipped
    prompts' groups are ALWAYS all-equal (a policy certain of the answer: no gradient). Then the skip
    changes nothing, exactly, so the bias above comes from the gradient the skipped prompts do carry."""
    toy = Toy()
    for j in (2, 3, 4):  # the prompts with streaks answer correctly (2) or wrongly (3, 4), always
        answer = int(toy.correct[j]) if j == 2 else (int(toy.correct[j]) + 1) % toy.K
        toy.pi[j] = torch.nn.functional.one_hot(torch.tensor(answer), toy.K).double()
    _, greso, ht = _greso_vs_full(toy, 500, _seed("greso", "certain"))
    assert greso.abs().max() < 1e-12 and ht.abs().max() < 1e-12
