"""DPPOExperienceMaker on real OpenRLHF Experience objects (CPU), forwards from stand-in actor groups.

What is checked: with zero pruning the advantages/returns are GRPO's bit for bit (three KL settings);
with pruning, only kept completions are forwarded, the keep mask is core's seeded draw, w = 1/(q p) is
folded into the advantages after the reward clip, the pruned completions are counted from the mask;
the history sees the groups dynamic filtering dropped. (The loss through the plan: test_planned_loss.py.)
"""

import copy
from types import SimpleNamespace

import pytest
import torch
from dppo_pipeline import args_for, dppo_maker, groups, grpo_maker, make, tag
from dppo_stand_ins import (
    StandInTokenizer,
    base_argv,
    make_args,
    rollout,
    rollout_batch,
)
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT
from openrlhf_dppo.core import DPPOConfig, completion_keep_probs, sample_mask, step_generator
from openrlhf_dppo.core.cppo import cppo_keep_mask

pytestmark = pytest.mark.usefixtures("stand_in_ray")


def by_sample(experiences, ids):
    """original rollout id -> (advantages, returns, return, mask) of its row."""
    out = {}
    for e in experiences:
        for b, pos in enumerate(e.index):
            n = int(e.action_mask[b].sum())
            start = int(e.action_mask[b].nonzero()[0])
            sl = slice(start, start + n)
            out[ids[pos]] = (e.advantages[b, sl], e.returns[b, sl], e.info["return"][b], e.info)
    return out


@pytest.mark.parametrize("estimator", ["group_norm", "rloo"])
@pytest.mark.parametrize("kl", ["none", "reward", "loss"])
def test_zero_pruning_reproduces_grpo_advantages_exactly(kl, estimator):
    args = args_for(kl=kl, extra=["--algo.advantage.estimator", estimator])
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(5, G, seed=1), G)
    grpo_samples = copy.deepcopy(samples)
    ours, _ = make(dppo_maker(args, DPPOConfig()), samples)
    theirs = grpo_maker(args).make_experience_batch(grpo_samples)  # the GRPO arm's
    n = len(samples)
    # the exact A == 0 drop, only without a KL term: the completions of all-equal groups are not trained
    rewards = torch.cat([s.rewards for s in samples]).reshape(-1, G)
    equal = (rewards == rewards[:, :1]).all(-1).repeat_interleave(G).tolist()
    kept = [i for i in range(n) if not (equal[i] and kl == "none")]
    a, b = by_sample(ours, kept), by_sample(theirs, list(range(n)))
    assert sorted(a) == kept and sorted(b) == list(range(n))
    assert (len(kept) < n) == (kl == "none")
    assert all(torch.count_nonzero(b[i][0]) == 0 for i in set(range(n)) - set(kept))  # GRPO's A: 0
    for i in kept:
        assert torch.equal(a[i][0], b[i][0]), i  # advantages
        assert torch.equal(a[i][1], b[i][1]), i  # returns
        assert torch.equal(a[i][2], b[i][2]), i  # info["return"]


@pytest.mark.parametrize("kl", ["none", "reward"])
def test_grpo_arm_gives_a_constant_group_of_an_inexact_reward_advantage_zero(kl):
    """Groups of eight wrong countdown answers (0.05 each) and one group with a solved member: the GRPO
    arm's experience maker gives the constant groups advantage 0 and the mixed group OpenRLHF's values
    (up to float32 rounding), as DPPO does; OpenRLHF's own float32 statistics give the constant groups
    order-1 advantages (the control: the defect this guards against)."""
    args = args_for(kl=kl)
    args.rollout.n_samples_per_prompt = G = 8  # float32's mean of four 0.05 happens to be exact
    rewards = [0.05] * (2 * G) + [1.0] + [0.05] * (G - 1)
    samples = [rollout(f"prompt {i // G}", 4, 3 + i % 5, r, seed=i) for i, r in enumerate(rewards)]
    n = len(samples)
    ours = by_sample(grpo_maker(args).make_experience_batch(tag(copy.deepcopy(samples), G)), list(range(n)))
    host = grpo_maker(args, RemoteExperienceMaker).make_experience_batch(tag(copy.deepcopy(samples), G))
    theirs = by_sample(host, list(range(n)))
    dppo, _ = make(dppo_maker(args, DPPOConfig()), tag(copy.deepcopy(samples), G))
    # without a KL term DPPO drops the constant groups exactly (advantage 0), with one it trains them
    kept = list(range(2 * G, n)) if kl == "none" else list(range(n))
    dppo_adv = by_sample(dppo, kept)
    assert sorted(dppo_adv) == kept and sum(len(e.index) for e in dppo) == len(kept)
    for i in range(n):
        assert ours[i][0].dtype == torch.float32
        if i in dppo_adv:
            assert torch.equal(ours[i][0], dppo_adv[i][0]), i  # both arms alike
        if i < 2 * G and kl == "none":  # constant groups (with a KL term the KL shaping adds to them)
            assert torch.equal(ours[i][0], torch.zeros_like(ours[i][0])), i
            assert float(theirs[i][0].abs().min()) > 0.5, i  # OpenRLHF in float32: -0.75 each
        elif i >= 2 * G:
            torch.testing.assert_close(ours[i][0], theirs[i][0], rtol=1e-6, atol=1e-6)


def test_pruning_forwards_only_kept_completions_and_folds_the_weights():
    args = args_for(dp=2)
    G = args.rollout.n_samples_per_prompt
    q = torch.tensor([0.5, 1.0, 0.25, 0.8, 1.0, 0.4])
    samples = tag(rollout_batch(6, G, seed=2), G, q)
    cfg = DPPOConfig(completion_prune_rate=0.5, p_min=0.1, seed=3)
    maker = dppo_maker(args, cfg)
    experiences, ctx = make(maker, samples, step=4)

    # recompute the decision with core: group advantages of the FULL groups, the same seeded draw
    rewards = torch.cat([s.rewards for s in samples]).reshape(-1, G)
    r64 = rewards.double()  # group statistics in float64 (core.group_advantages), returned in float32
    adv = ((r64 - r64.mean(-1, keepdim=True)) / (r64.std(-1, keepdim=True) + 1e-9)).float().reshape(-1)
    p, _ = completion_keep_probs(adv, 0.5, 0.1, allow_zero=True)
    mask, p_used = sample_mask(p, step_generator(3, 4, 1), multiple_of=2)
    kept = mask.nonzero().flatten().tolist()
    assert 0 < len(kept) < len(samples) and len(kept) % 2 == 0
    assert maker.actor_model_group.forwarded == len(kept)  # forwards ran on kept completions only
    assert all(adv[i] != 0 for i in kept)  # A == 0 has p = 0 without KL / entropy terms

    rows = by_sample(experiences, kept)
    assert sorted(rows) == kept
    for i in kept:
        advantages, returns, _, _ = rows[i]
        w = (1.0 / q[i // G].double()) / p_used[i]
        assert torch.equal(
            returns[-1], adv[i].clamp(-10, 10).to(returns.dtype)
        )  # A (clipped) at the last token
        assert torch.equal(advantages, returns * w.to(returns.dtype))  # weight folded after the clip
    weights = torch.cat([e.info[SAMPLE_WEIGHT] for e in experiences])
    assert weights.min() >= 1.0
    m = ctx.metrics
    tokens = [int(s.action_mask.sum()) for s in samples]
    assert m["tokens/pruned"] == sum(tokens) - sum(tokens[i] for i in kept)  # counted from the mask
    assert m["samples/pruned"] == len(samples) - len(kept) and "samples/trained" not in m
    assert m["dppo/completion_keep_frac"] == len(kept) / len(samples)
    assert maker.history.count[:6].tolist() == [1] * 6  # every rolled-out prompt recorded once


def test_the_history_sees_the_groups_dynamic_filtering_dropped():
    """Two always-solved prompts (10, 11) were dropped by the filter before the maker saw the batch:
    the history records them like the trained ones, so their score falls and prompt pruning can skip
    them next time (with the filter dropping them unseen, they would stay unseen, q = 1, for ever)."""
    args = args_for(extra=["--algo.dynamic_filtering_enable"])
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(4, G, seed=8), G)
    dropped = [rollout(f"solved {j}", 4, 3, 1.0, seed=j * 10 + i) for j in (10, 11) for i in range(G)]
    dropped = tag(dropped, G, index=[10, 11])
    maker = dppo_maker(args, DPPOConfig(completion_prune_rate=0.5, p_min=0.2))
    assert torch.isinf(maker.history.score(torch.tensor([10, 11]), G)).all()
    _, ctx = make(maker, samples, step=3, filtered=dropped)
    assert maker.history.count[[0, 1, 2, 3, 10, 11]].tolist() == [1] * 6
    assert maker.history.last_step[[10, 11]].tolist() == [3, 3]
    # recorded like the trained all-solved prompt 2 (rollout_batch: every third group is all 1): the
    # score of an all-right group, 1 - (5/6)^4 - (1/6)^4 with the Beta(1, 1) prior, no longer unseen
    scores = maker.history.score(torch.tensor([2, 10, 11]), G)
    assert torch.equal(scores[1:], scores[:1].expand(2)) and float(scores[0]) == pytest.approx(
        1 - (5 / 6) ** 4 - (1 / 6) ** 4, rel=1e-6
    )
    assert ctx.metrics["samples/pruned"] <= len(samples)  # the dropped groups are not the maker's


def test_with_a_kl_term_zero_advantage_completions_keep_a_positive_probability():
    args = args_for(kl="loss")
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(6, G, seed=5), G)
    maker = dppo_maker(args, DPPOConfig(completion_prune_rate=0.5, p_min=0.2))
    rewards = torch.cat([s.rewards.float() for s in samples]).reshape(-1, G)
    r64 = rewards.double()  # group statistics in float64 (core.group_advantages), returned in float32
    adv = ((r64 - r64.mean(-1, keepdim=True)) / (r64.std(-1, keepdim=True) + 1e-9)).float().reshape(-1)
    p_used = maker._completion_draw(adv, torch.ones_like(adv, dtype=torch.float64), 1, 0)[0].prob
    assert (adv == 0).any()
    assert (p_used[adv == 0] >= 0.2 - 1e-12).all()
    maker_no_kl = dppo_maker(args_for(), DPPOConfig(completion_prune_rate=0.5, p_min=0.2))
    p_free = maker_no_kl._completion_draw(adv, torch.ones_like(adv, dtype=torch.float64), 1, 0)[0].prob
    assert (p_free[adv == 0] == 0).all() and (p_free[adv != 0] > 0).all()


@pytest.mark.parametrize("kl", ["none", "reward", "loss"])
def test_the_step_reports_how_many_completions_the_exact_zero_advantage_drop_gave_p_0(kl):
    # dppo/completion_zero_prob_frac: every A == 0 completion without a KL / entropy term, none with one
    args = args_for(kl=kl)
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(6, G, seed=5), G)
    _, ctx = make(dppo_maker(args, DPPOConfig(completion_prune_rate=0.5)), samples, step=1, drawn=6)
    zero_adv = ctx.metrics["dppo/completion_zero_adv_frac"]
    assert zero_adv > 0  # rollout_batch makes every third group all-equal
    expected = zero_adv if kl == "none" else 0.0  # both are fractions of 24 completions (float32 vs 64)
    assert ctx.metrics["dppo/completion_zero_prob_frac"] == pytest.approx(expected, abs=1e-6)


RB = ["--algo.advantage.estimator", "reinforce_baseline"]


@pytest.mark.parametrize("kl", ["none", "reward", "loss"])
@pytest.mark.parametrize("std_norm", [True, False])
def test_reinforce_baseline_without_pruning_is_openrlhfs(kl, std_norm):
    """REINFORCE++-baseline, nothing pruned: the group mean on the full groups, then the whole batch's
    token mean and std, as OpenRLHF's own experience maker makes them (its float32 whitening against
    our float64: equal to float32 rounding)."""
    args = args_for(kl=kl, extra=RB + ([] if std_norm else ["--algo.advantage.no_std_norm"]))
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(5, G, seed=4), G)
    n = len(samples)
    ours, ctx = make(dppo_maker(args, DPPOConfig()), copy.deepcopy(samples))
    host = grpo_maker(args, RemoteExperienceMaker).make_experience_batch(copy.deepcopy(samples))
    grpo = grpo_maker(args).make_experience_batch(copy.deepcopy(samples))  # the GRPO arm's
    a, b, c = (by_sample(e, list(range(n))) for e in (ours, host, grpo))
    for i in range(n):
        torch.testing.assert_close(a[i][0], b[i][0], rtol=1e-5, atol=1e-5)  # advantages
        torch.testing.assert_close(a[i][0], c[i][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a[i][1], b[i][1], rtol=1e-6, atol=1e-6)  # returns (before whitening)
    # the whitening is really there: an all-equal group's completions get -m / s, not 0
    assert ctx.metrics["dppo/advantage_token_mean"] != 0.0 and ctx.metrics["dppo/advantage_token_rstd"] > 0
    if not std_norm:
        assert ctx.metrics["dppo/advantage_token_rstd"] == 1.0


def test_reinforce_baseline_under_pruning_whitens_with_the_horvitz_thompson_token_statistics():
    """With prompt and completion pruning the token mean and std are the kept tokens' weighted by
    1/(q p) (core.token_whitening), the weight is folded in after, and no completion gets the exact
    A == 0 drop: the batch mean gives it the advantage -m / s."""
    args = args_for(dp=2, extra=RB)
    G = args.rollout.n_samples_per_prompt
    q = torch.tensor([0.5, 1.0, 0.25, 0.8, 1.0, 0.4])
    samples = tag(rollout_batch(6, G, seed=2), G, q)
    cfg = DPPOConfig(completion_prune_rate=0.5, p_min=0.1, seed=3)
    experiences, ctx = make(dppo_maker(args, cfg), samples, step=4)
    assert ctx.metrics["dppo/completion_zero_prob_frac"] == 0.0  # no free drop under whitening
    num = den = sq = 0.0
    rows = []
    for e in experiences:
        w = e.info[SAMPLE_WEIGHT].double()
        for b in range(len(e.index)):
            m = e.action_mask[b].bool()
            rows.append((e.returns[b][m].double(), float(w[b]), e.advantages[b][m].double()))
    for ret, w, _ in rows:
        num, den = num + w * float(ret.sum()), den + w * len(ret)
    mean = num / den
    for ret, w, _ in rows:
        sq += w * float((ret - mean).pow(2).sum())
    rstd = (sq / den) ** -0.5
    assert ctx.metrics["dppo/advantage_token_mean"] == pytest.approx(mean, rel=1e-6)  # info weights: float32
    assert ctx.metrics["dppo/advantage_token_rstd"] == pytest.approx(rstd, rel=1e-6)
    for ret, w, adv in rows:
        torch.testing.assert_close(adv, ((ret - mean) * rstd * w), rtol=1e-5, atol=1e-6)
    assert min(w for _, w, _ in rows) >= 1.0 and len({w for _, w, _ in rows}) > 1  # really reweighted


# ---- CPPO (--dppo.method cppo): the biased peer ------------------------------------------------------


def cppo_maker(args, cfg):
    from openrlhf_dppo.adapters.experience_maker import CPPOExperienceMaker

    actor, ref = groups(args)
    kl = FixedKLController(args.algo.kl.init_coef)
    return CPPOExperienceMaker(
        actor, None, None, ref, kl, SimpleNamespace(args=args), StandInTokenizer(), dppo=cfg
    )


def _grpo_advantages(samples, G):
    r64 = torch.cat([s.rewards for s in samples]).reshape(-1, G).double()
    return ((r64 - r64.mean(-1, keepdim=True)) / (r64.std(-1, keepdim=True) + 1e-9)).float()


@pytest.mark.parametrize("kl", ["none", "reward"])
def test_cppo_trains_the_top_abs_advantages_of_each_full_group_at_weight_one(kl):
    """The G - int(G P) completions of largest |A| of each group (A of the FULL group), forwarded alone,
    at weight 1 (A folded times 1), normalised by the kept count and tokens; the all-equal groups keep
    their first k too (no exact A == 0 drop under CPPO, with or without a KL term)."""
    args = args_for(kl=kl)
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(6, G, seed=2), G)
    grpo = by_sample(grpo_maker(args).make_experience_batch(tag(copy.deepcopy(samples), G)), list(range(24)))
    cfg = DPPOConfig(method="cppo", completion_prune_rate=0.5)
    maker = cppo_maker(args, cfg)
    experiences, ctx = make(maker, samples, step=3, drawn=6)
    adv = _grpo_advantages(samples, G)
    kept = cppo_keep_mask(adv, 0.5).reshape(-1).nonzero().flatten().tolist()
    assert len(kept) == 12 and all(len([i for i in kept if i // G == j]) == 2 for j in range(6))
    assert [i for i in kept if i // G == 2] == [8, 9]  # group 2 is all-equal (A = 0): its first two
    assert maker.actor_model_group.forwarded == len(kept)
    rows = by_sample(experiences, kept)
    assert sorted(rows) == kept
    for i in kept:  # weight 1: CPPO's advantages are GRPO's, row for row
        assert torch.equal(rows[i][0], grpo[i][0]), i
        assert torch.equal(rows[i][1], grpo[i][1]), i
    assert torch.cat([e.info[SAMPLE_WEIGHT] for e in experiences]).eq(1.0).all()
    m = ctx.metrics
    tokens = [int(s.action_mask.sum()) for s in samples]
    assert m["samples/pruned"] == 12 and m["tokens/pruned"] == sum(tokens) - sum(tokens[i] for i in kept)
    assert m["dppo/normalizer_seqs"] == 12 and m["dppo/normalizer_tokens"] == sum(tokens[i] for i in kept)
    assert m["dppo/weight_mean"] == m["dppo/weight_max"] == 1.0 and m["dppo/completion_keep_frac"] == 0.5
    assert m["dppo/completion_zero_prob_frac"] == 0.0
    assert maker.history is None  # CPPO keeps no prompt history


@pytest.mark.parametrize("batch,train,P,expected", [(4, 16, 0.5, 1), (4, 8, 0.5, 2), (3, 8, 0.25, 1)])
def test_cppos_optimizer_steps_are_grpos_update_size_on_the_kept_completions(batch, train, P, expected):
    """int(B / (1 - P)) prompts drawn, G - int(G P) kept of each, their whole --train.batch_size batches:
    B G / T for B = 4, G = 4 at P = 0.5 (8 prompts, 2 kept each: 16); 3 / 0.75 = 4 prompts at P = 0.25
    keep 3 each: 12 completions, one batch of 8."""
    from openrlhf_dppo.core.cppo import cppo_prompts

    args = make_args(base_argv(batch=batch, train_batch=train))
    G = args.rollout.n_samples_per_prompt
    drawn = cppo_prompts(batch, P)
    samples = tag(rollout_batch(drawn, G, seed=4), G)
    _, ctx = make(cppo_maker(args, DPPOConfig(method="cppo", completion_prune_rate=P)), samples, drawn=drawn)
    assert ctx.metrics["dppo/optimizer_steps"] == expected


def test_a_pruned_prompt_never_reaches_cppos_maker():
    args = args_for()
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(2, G, seed=1), G, q=[0.5, 1.0])
    with pytest.raises(RuntimeError, match="q = 1"):
        make(cppo_maker(args, DPPOConfig(method="cppo", completion_prune_rate=0.5)), samples, drawn=2)
