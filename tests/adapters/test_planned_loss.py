"""The policy loss through the dispatch plan + DPPO replay buffer + OpenRLHF's get_loss_batch_info:
equal to the weighted full-batch loss exactly (PPO, dual clip, GSPO, rollout IS corrections, seq-mean)
for a fixed mask, and equal to GRPO's full-batch loss in expectation (Monte-Carlo) for one and for both
pruning levels, where dividing by the kept count is not."""

import copy
from types import SimpleNamespace

import pytest
import torch
from dppo_pipeline import ACTOR, args_for, dppo_maker, grpo_maker, make, tag
from dppo_stand_ins import rollout_batch
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.utils.loss_utils import get_loss_batch_info

from openrlhf_dppo.adapters.actor import DPPOReplayBuffer
from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT
from openrlhf_dppo.core import DPPOConfig, step_generator

pytestmark = pytest.mark.usefixtures("stand_in_ray")


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
    cfg = DPPOConfig(completion_prune_rate=0.4, p_min=0.2, seed=11)
    maker = dppo_maker(args, cfg)
    experiences, ctx = make(maker, samples, step=1, drawn=9)  # 9 prompts drawn, 6 rolled out
    loss_fn = PolicyLoss(**LOSSES[name])
    token_level = loss_fn.token_level_loss

    theta = torch.tensor(0.3, requires_grad=True)
    planned, _ = planned_loss(args, experiences.plan, loss_fn, theta)
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
    assert experiences.plan.num_steps == 1
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

    full = grpo_maker(args, RemoteExperienceMaker).make_experience_batch(copy.deepcopy(samples))
    z_full = float(sum(e.action_mask.sum() for e in full))
    target = sum(
        loss_fn(
            new_logprobs(e, theta), e.action_log_probs, e.advantages, e.action_mask, batch_num_tokens=z_full
        )[0]
        for e in full
    )
    (g_target,) = torch.autograd.grad(target, theta)

    cfg = DPPOConfig(completion_prune_rate=0.5, p_min=0.05, seed=0)
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
    full = grpo_maker(args, RemoteExperienceMaker).make_experience_batch(copy.deepcopy(samples))
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
    cfg = DPPOConfig(prompt_prune_rate=0.5, completion_prune_rate=0.3, p_min=0.2)
    values = []
    for r in range(300):
        draw, _ = prune_prompts(scores, 0.5, 0.1, step_generator(99, r, 0))
        kept_prompts = draw.mask.nonzero().flatten().tolist()
        rolled = [copy.copy(s) for j in kept_prompts for s in samples[j * G : (j + 1) * G]]
        rolled = tag(rolled, G, q=[draw.prob[j] for j in kept_prompts], index=kept_prompts)
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
