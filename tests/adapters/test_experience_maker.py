"""DPPOExperienceMaker on real OpenRLHF Experience objects (CPU), forwards from stand-in actor groups.

What is checked: with zero pruning the advantages/returns are GRPO's bit for bit (three KL settings);
with pruning, only kept completions are forwarded, the keep mask is core's seeded draw, w = 1/(q p) is
folded into the advantages after the reward clip; the policy loss through the dispatch plan + replay
buffer equals the weighted full-batch loss exactly (PPO, dual clip, GSPO, seq-mean) for a fixed mask, and
equals GRPO's full-batch loss in expectation (Monte-Carlo), where dividing by the kept count does not.
"""

import copy
from types import SimpleNamespace

import pytest
import torch
from dppo_stand_ins import (
    StandInGroup,
    StandInTokenizer,
    base_argv,
    logprob_fn,
    make_args,
    rollout,
    rollout_batch,
)
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.utils.loss_utils import get_loss_batch_info

from openrlhf_dppo.adapters.actor import DPPOReplayBuffer
from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT
from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker
from openrlhf_dppo.adapters.step import PROMPT_ATTR, DrawRecord, PromptDraw, StepContext
from openrlhf_dppo.core import DPPOConfig, PromptHistory, completion_keep_probs, sample_mask, step_generator

ACTOR = logprob_fn(0.01, 0.05, 5)
REF = logprob_fn(0.02, 0.07, 3)


pytestmark = pytest.mark.usefixtures("stand_in_ray")


_ARGS = {}


def args_for(dp=1, kl="none", extra=()):
    key = (dp, kl, tuple(extra))
    if key not in _ARGS:
        argv = base_argv(dp=dp)
        if kl != "none":
            argv = [
                a if a != "0" or argv[i - 1] != "--algo.kl.init_coef" else "0.05" for i, a in enumerate(argv)
            ]
        if kl == "loss":
            argv += ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]
        _ARGS[key] = make_args(argv + list(extra))
    return copy.deepcopy(_ARGS[key])


def tag(samples, group, q=None):
    for i, s in enumerate(samples):
        j = i // group
        setattr(s, PROMPT_ATTR, PromptDraw(j, 1.0 if q is None else float(q[j])))
    return samples


def groups(args):
    ref = StandInGroup(REF, 1) if args.algo.kl.init_coef > 0 else None
    return StandInGroup(ACTOR, 1), ref


def dppo_maker(args, cfg):
    actor, ref = groups(args)
    strategy = SimpleNamespace(args=args)
    kl = FixedKLController(args.algo.kl.init_coef)
    return DPPOExperienceMaker(
        actor, None, None, ref, kl, strategy, StandInTokenizer(), dppo=cfg, history=PromptHistory(16)
    )


def make(maker, samples, step=0, drawn=None, filtered=()):
    """One step through the maker: (experiences, the StepContext it filled). drawn: the prompts the
    generator drew (None: no draw record, as with dynamic filtering's HT count)."""
    ctx = StepContext(
        step=step, draw=None if drawn is None else DrawRecord(drawn=drawn), filtered=list(filtered)
    )
    return maker.make_experience_batch(ctx, samples), ctx


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


@pytest.mark.parametrize("kl", ["none", "reward", "loss"])
def test_zero_pruning_reproduces_grpo_advantages_exactly(kl):
    args = args_for(kl=kl)
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(5, G, seed=1), G)
    grpo_samples = copy.deepcopy(samples)
    cfg = DPPOConfig(drop_zero_advantage=False)
    ours, _ = make(dppo_maker(args, cfg), samples)
    actor, ref = groups(args)
    host = RemoteExperienceMaker(actor, None, None, ref, FixedKLController(args.algo.kl.init_coef),
                                 SimpleNamespace(args=args), StandInTokenizer())  # fmt: skip
    theirs = host.make_experience_batch(grpo_samples)
    n = len(samples)
    a, b = by_sample(ours, list(range(n))), by_sample(theirs, list(range(n)))
    assert sorted(a) == sorted(b) == list(range(n))
    for i in range(n):
        assert torch.equal(a[i][0], b[i][0]), i  # advantages
        assert torch.equal(a[i][1], b[i][1]), i  # returns
        assert torch.equal(a[i][2], b[i][2]), i  # info["return"]


def test_pruning_forwards_only_kept_completions_and_folds_the_weights():
    args = args_for(dp=2)
    G = args.rollout.n_samples_per_prompt
    q = torch.tensor([0.5, 1.0, 0.25, 0.8, 1.0, 0.4])
    samples = tag(rollout_batch(6, G, seed=2), G, q)
    cfg = DPPOConfig(completion_prune_rate=0.5, completion_policy="proportional", p_min=0.1, seed=3)
    maker = dppo_maker(args, cfg)
    experiences, ctx = make(maker, samples, step=4)

    # recompute the decision with core: group advantages of the FULL groups, the same seeded draw
    rewards = torch.cat([s.rewards for s in samples]).reshape(-1, G)
    adv = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)).reshape(-1)
    p, _ = completion_keep_probs(adv, 0.5, "proportional", 0.1, allow_zero=True)
    mask, p_used = sample_mask(p, "systematic", step_generator(3, 4, 1), multiple_of=2)
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
    for i, s in enumerate(dropped):
        setattr(s, PROMPT_ATTR, PromptDraw(10 + i // G, 1.0))
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
    adv = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)).reshape(-1)
    p_used = maker._completion_draw(adv, torch.ones_like(adv, dtype=torch.float64), 1, 0)[0].prob
    assert (adv == 0).any()
    assert (p_used[adv == 0] >= 0.2 - 1e-12).all()
    maker_no_kl = dppo_maker(args_for(), DPPOConfig(completion_prune_rate=0.5, p_min=0.2))
    p_free = maker_no_kl._completion_draw(adv, torch.ones_like(adv, dtype=torch.float64), 1, 0)[0].prob
    assert (p_free[adv == 0] == 0).all() and (p_free[adv != 0] > 0).all()


# ---- the loss through the dispatch plan + replay buffer -------------------------------------------


def new_logprobs(exp, theta):
    """A 'trained' policy: old log-probs shifted per token by theta * (token % 3 - 1)."""
    feature = (exp.sequences[:, 1:] % 3).float() - 1.0
    return exp.action_log_probs + theta * feature * exp.action_mask


def planned_loss(args, plan, loss_fn, theta):
    """Sum over ranks and micro-batches of the rank losses, as the DPPO replay buffer feeds them."""
    strategy = SimpleNamespace(args=args)
    total, per_step, step_losses = 0.0, [], 0.0
    for rank_exp in plan.rank_experiences():
        buffer = DPPOReplayBuffer(1, 0, True, True, True)
        buffer.append(rank_exp)
        buffer.setup_dynamic_batch(strategy)
        assert len(buffer) == plan.micro_batches_per_rank
        for step in range(len(buffer)):
            mb = buffer.collate_fn([buffer[step]])
            assert int(mb.attention_mask.sum()) <= args.train.max_tokens_per_gpu
            info = get_loss_batch_info(
                strategy, mb.action_mask, replay_buffer=buffer, step=step, dynamic_batch=True
            )
            loss = loss_fn(
                new_logprobs(mb, theta),
                mb.action_log_probs,
                mb.advantages,
                mb.action_mask,
                rollout_log_probs=mb.rollout_log_probs * mb.action_mask,
                **info,
            )[0]
            total = total + loss
            step_losses = step_losses + loss
            if buffer.dynamic_optimizer_step[step]:
                per_step.append(step_losses)
                step_losses = 0.0
    return total, per_step


def reference_loss(samples, kept, weights, adv, z, token_level, loss_fn, theta, actor_fn):
    """(1/Z) sum over kept of w_i * l_i(A_i): the per-sample PolicyLoss with the UNWEIGHTED advantage."""
    total = 0.0
    for i in kept:
        s = samples[i]
        old = actor_fn(s.sequences, s.action_mask, s.attention_mask)
        mask = s.action_mask
        exp = SimpleNamespace(sequences=s.sequences, action_log_probs=old, action_mask=mask)
        a = adv[i].clamp(-10, 10) * mask.float()
        one = {"batch_num_tokens": 1.0} if token_level else {"global_batch_size": 1.0}
        rollout_lp = s.rollout_log_probs * mask
        li = loss_fn(new_logprobs(exp, theta), old, a, mask, rollout_log_probs=rollout_lp, **one)[0]
        total = total + weights[i] * li
    return total / z


LOSSES = {
    "ppo-token": dict(),
    "ppo-seq": dict(token_level_loss=False),
    "dual-clip": dict(dual_clip=3.0, clip_eps_low=0.1, clip_eps_high=0.28),
    "gspo": dict(policy_loss_type="gspo"),
    "is-token-mask": dict(is_correction_level="token", is_correction_threshold=[0.8, 1.25]),
    "is-token-clip": dict(
        is_correction_level="token", is_correction_mode="clip", is_correction_threshold=[0.8, 1.25]
    ),
    "is-seq-mask": dict(is_correction_level="seq", is_correction_threshold=[0.9, 1.1]),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_planned_loss_and_gradient_equal_the_weighted_full_batch_loss_for_a_fixed_mask(name):
    args = args_for(dp=2)
    G = args.rollout.n_samples_per_prompt
    q = torch.tensor([0.5, 1.0, 0.25, 0.8, 1.0, 0.4])
    samples = tag(rollout_batch(6, G, seed=7, binary=False), G, q)
    cfg = DPPOConfig(completion_prune_rate=0.4, completion_policy="uniform-low", p_min=0.2, seed=11)
    maker = dppo_maker(args, cfg)
    experiences, ctx = make(maker, samples, step=1, drawn=9)  # 9 prompts drawn, 6 rolled out
    loss_fn = PolicyLoss(**LOSSES[name])
    token_level = loss_fn.token_level_loss

    theta = torch.tensor(0.3, requires_grad=True)
    planned, _ = planned_loss(args, ctx.dispatch, loss_fn, theta)
    (g_planned,) = torch.autograd.grad(planned, theta)

    rewards = torch.cat([s.rewards for s in samples]).reshape(-1, G)
    adv = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)).reshape(-1)
    train_ids = [i for i, s in enumerate(samples) if s.index is not None]  # split_rollout_samples marks them
    assert len(train_ids) == sum(len(e.index) for e in experiences) < len(samples)
    weights = torch.zeros(len(samples), dtype=torch.float64)
    pos = torch.tensor([p for e in experiences for p in e.index])
    weights[torch.tensor(train_ids)[pos]] = torch.cat([e.info[SAMPLE_WEIGHT] for e in experiences]).double()
    tokens = torch.tensor([float(s.action_mask.sum()) for s in samples]).reshape(-1, G).sum(-1)
    z = (tokens.double() / q.double()).sum() if token_level else 9 * G
    assert ctx.metrics["dppo/normalizer_seqs"] == 9 * G
    ref = reference_loss(samples, train_ids, weights, adv, z, token_level, loss_fn, theta, ACTOR)
    (g_ref,) = torch.autograd.grad(ref, theta)
    assert ctx.dispatch.num_steps == 1
    torch.testing.assert_close(planned.double(), ref.double(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g_planned.double(), g_ref.double(), rtol=1e-5, atol=1e-7)


def test_loss_and_gradient_are_unbiased_in_expectation_and_the_kept_count_normaliser_is_not():
    """Monte-Carlo over the completion masks (steps 0..R-1): E[DPPO loss] == GRPO full-batch loss.

    Completion pruning only, so the Horvitz-Thompson token normaliser is exact and the estimator is
    exactly unbiased; the negative control divides by the kept tokens instead and must miss the target.
    """
    args = args_for()
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(6, G, seed=13, binary=False), G)
    loss_fn = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    theta = torch.tensor(0.3, requires_grad=True)

    actor, _ = groups(args)
    host = RemoteExperienceMaker(actor, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                 StandInTokenizer())  # fmt: skip
    full = host.make_experience_batch(copy.deepcopy(samples))
    z_full = float(sum(e.action_mask.sum() for e in full))
    target = sum(
        loss_fn(
            new_logprobs(e, theta), e.action_log_probs, e.advantages, e.action_mask, batch_num_tokens=z_full
        )[0]
        for e in full
    )
    (g_target,) = torch.autograd.grad(target, theta)

    cfg = DPPOConfig(completion_prune_rate=0.5, completion_policy="proportional", p_min=0.05, seed=0)
    values, grads, biased = [], [], []
    for r in range(300):
        exps, ctx = make(dppo_maker(args, cfg), samples, step=r)
        z = ctx.metrics["dppo/normalizer_tokens"]
        assert z == z_full
        kept_tokens = float(sum(e.action_mask.sum() for e in exps))
        terms = [loss_fn(new_logprobs(e, theta), e.action_log_probs, e.advantages, e.action_mask,
                         batch_num_tokens=1.0)[0] for e in exps]  # fmt: skip
        loss = sum(terms) / z
        (g,) = torch.autograd.grad(loss, theta)
        values.append(loss.item())
        grads.append(g.item())
        biased.append(sum(terms).item() / kept_tokens)
    for est, truth in ((values, target.item()), (grads, g_target.item())):
        est = torch.tensor(est, dtype=torch.float64)
        se = est.std() / len(est) ** 0.5
        assert se < 0.2 * abs(truth)  # the test has power
        assert abs(est.mean() - truth) < 4 * se, (est.mean().item(), truth, se.item())
    biased = torch.tensor(biased, dtype=torch.float64)
    assert abs(biased.mean() - target.item()) > 10 * biased.std() / len(biased) ** 0.5


def toward_advantage(exp, theta):
    return exp.action_log_probs + theta * torch.sign(exp.advantages) * exp.action_mask


def test_both_levels_together_are_unbiased_for_the_seq_mean_loss():
    """Prompt pruning (q from fixed scores, drawn as the samples generator draws) + completion pruning:
    E[DPPO seq-mean loss] == GRPO's full-batch seq-mean loss, with Z = B_drawn * G exactly. The policy
    moves toward the sign of A (weights are positive: same move for both), so the clipped loss does not
    cancel within a group and the target is far from 0."""
    from openrlhf_dppo.core import prune_prompts

    args = args_for()
    G, B = args.rollout.n_samples_per_prompt, 6
    samples = rollout_batch(B, G, seed=17, binary=False)
    loss_fn = PolicyLoss(token_level_loss=False)
    theta = torch.tensor(0.3)
    actor, _ = groups(args)
    host = RemoteExperienceMaker(actor, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                 StandInTokenizer())  # fmt: skip
    full = host.make_experience_batch(copy.deepcopy(samples))
    target = sum(
        loss_fn(
            toward_advantage(e, theta),
            e.action_log_probs,
            e.advantages,
            e.action_mask,
            global_batch_size=B * G,
        )[0]
        for e in full
    ).item()

    scores = torch.tensor([0.9, 0.2, 0.5, 0.05, 0.7, 0.3], dtype=torch.float64)
    cfg = DPPOConfig(
        prompt_prune_rate=0.5, completion_prune_rate=0.3, completion_policy="uniform-low", p_min=0.2
    )
    values = []
    for r in range(300):
        draw, _ = prune_prompts(scores, 0.5, 0.1, "systematic", step_generator(99, r, 0))
        kept_prompts = draw.mask.nonzero().flatten().tolist()
        rolled = []
        for j in kept_prompts:
            for s in samples[j * G : (j + 1) * G]:
                s = copy.copy(s)
                setattr(s, PROMPT_ATTR, PromptDraw(j, float(draw.prob[j])))
                rolled.append(s)
        exps, ctx = make(dppo_maker(args, cfg), rolled, step=r, drawn=B)
        assert ctx.metrics["dppo/normalizer_seqs"] == B * G
        loss = sum(
            loss_fn(
                toward_advantage(e, theta),
                e.action_log_probs,
                e.advantages,
                e.action_mask,
                global_batch_size=B * G,
            )[0]
            for e in exps
        )
        values.append(loss.item())
    est = torch.tensor(values, dtype=torch.float64)
    se = est.std() / len(est) ** 0.5
    assert se < 0.25 * abs(target)
    assert abs(est.mean() - target) < 4 * se, (est.mean().item(), target, se.item())
