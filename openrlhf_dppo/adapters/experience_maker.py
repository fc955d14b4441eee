"""The experience makers (seam: ``RemoteExperienceMaker.make_experience_batch(rollouts)``, the step's
``StepContext`` on ``rollouts.ctx``): ``DPPOExperienceMaker`` (docs/METHOD.md, "Completion pruning"),
``CPPOExperienceMaker`` ("The peers: CPPO and GRESO") and, for GRPO, ``CountingExperienceMaker``.

DPPO's order: length penalties on all rollouts, group advantages on the FULL groups, the history's
update, ``core.prune_completions``, forwards of the kept completions only, OpenRLHF's group-estimator
advantages (REINFORCE++-baseline whitened with the weights, ``core.token_whitening``), THEN the weights
1 / (q_j p_ji) folded in, then the full batch's normalisers and the packed plan (``PlannedExperiences``).
Fewer kept completions than data-parallel ranks are topped up with zero-weight fillers.
"""

from __future__ import annotations

import copy

import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience import Experience, split_experience_batch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters.dispatch import build_dispatch, forward_partitions, mark_short_batch_rule
from openrlhf_dppo.adapters.step import (
    PlannedExperiences,
    StepContext,
    effective_dp_size,
    group_draws,
    num_optimizer_steps,
    response_tokens,
    shaped_rewards,
    update_history,
    zero_advantage_is_exact,
)
from openrlhf_dppo.core import (
    BATCH_WHITENED,
    Draw,
    fold_weights,
    full_batch_normalizer,
    group_advantages,
    keep_metrics,
    micro_batch_capacity,
    prune_completions,
    step_generator,
    token_whitening,
    weight_metrics,
)
from openrlhf_dppo.core.cppo import cppo_keep_mask, cppo_kept_per_group, cppo_prompts


class DPPOExperienceMaker(RemoteExperienceMaker):
    def __init__(self, *args, dppo, history, **kwargs):
        super().__init__(*args, **kwargs)
        self.dppo = dppo
        self.history = history

    def _completion_draw(self, adv_flat: torch.Tensor, prompt_weight: torch.Tensor, dp: int, step: int):
        """core.prune_completions with this run's settings (seed stream: the step): (Draw, metrics)."""
        cfg = self.dppo
        return prune_completions(
            adv_flat,
            cfg.completion_keep_frac,
            cfg.p_min,
            allow_zero=zero_advantage_is_exact(self.args),
            generator=step_generator(cfg.seed, step, 1),
            multiple_of=dp,
            prompt_weight=prompt_weight,
        )

    @staticmethod
    def _top_up(mask: torch.Tensor, lengths: list[int], dp: int) -> list[int]:
        """Indices of zero-weight fillers so that at least ``dp`` items are kept (shortest first)."""
        need = dp - int(mask.sum())
        if need <= 0:
            return []
        free = sorted((n, i) for i, n in enumerate(lengths) if not mask[i])
        return [i for _, i in free[:need]]

    @torch.no_grad()
    def make_experience_batch(self, rollout_samples) -> PlannedExperiences:
        """rollout_samples: the step's ``Rollouts`` (whole groups). Returns the kept completions'
        experiences with the step's dispatch plan; metrics and counts go to the context."""
        ctx, args, G = rollout_samples.ctx, self.args, self.args.rollout.n_samples_per_prompt
        dp = effective_dp_size(args)

        draws = group_draws(ctx, rollout_samples, G)
        rewards = shaped_rewards(rollout_samples, args)
        adv = group_advantages(rewards, args.algo.advantage.estimator)
        if self.history is not None:  # None: the asynchronous generator keeps it (adapters.async_trainer)
            update_history(self.history, ctx, rollout_samples, args, shaped=rewards)

        adv_flat = adv.reshape(-1)
        q = torch.tensor([d.q for d in draws], dtype=torch.float64)
        draw, metrics = self._completion_draw(adv_flat, (1.0 / q).repeat_interleave(G), dp, ctx.step)
        mask, weights = draw.mask, draw.weight.clone()
        metrics.setdefault(rd.COMPLETION_ZERO_PROB_FRAC, float((draw.prob == 0).double().mean()))
        tokens = [response_tokens(s) for s in rollout_samples]
        kept = mask.nonzero().flatten().tolist()
        lengths = [int(s.total_length.item()) for s in rollout_samples]
        fillers = self._top_up(mask, lengths, dp)
        weights[fillers] = 0.0
        z_tok, z_seq = self._normalizers(ctx, tokens, q, mask)
        metrics[rd.NORMALIZER_TOKENS], metrics[rd.NORMALIZER_SEQS] = z_tok, z_seq

        train_ids = sorted(kept + fillers)
        kept_samples = [rollout_samples[i] for i in train_ids]
        train_weights = weights[train_ids]
        # fewer rollouts than ranks: zero-weight copies of the shortest, one sequence per rank
        copies = dp - len(train_ids)
        if copies > 0:
            shortest = min(range(len(lengths)), key=lengths.__getitem__)
            kept_samples += [copy.copy(rollout_samples[shortest]) for _ in range(copies)]
            train_ids += [shortest] * copies
            train_weights = torch.cat([train_weights, train_weights.new_zeros(copies)])
        metrics[rd.COMPLETION_FILLERS] = float(len(kept_samples) - len(kept))
        experiences = self.make_experience(self._forward_batches(kept_samples, dp))
        metrics.update(forward_batch_metrics(experiences))
        metrics.update(
            self._set_advantages(experiences, adv_flat[train_ids], train_weights, rewards, train_ids)
        )

        items = self._single_items(experiences)
        capacity = micro_batch_capacity(
            args.train.max_tokens_per_gpu, args.ds.ring_attn_size, args.ds.tensor_parallel_size
        )
        plan = build_dispatch(items, dp, capacity, self._optimizer_steps(ctx, len(draws)), z_tok, z_seq)
        metrics.update(plan.metrics)
        ctx.metrics.update(metrics)
        pruned = (~mask).nonzero().flatten().tolist()
        ctx.add({rd.SAMPLES_PRUNED: len(pruned), rd.TOKENS_PRUNED: sum(tokens[i] for i in pruned)})
        return PlannedExperiences(experiences, plan)

    def _optimizer_steps(self, ctx: StepContext, groups: int) -> int:
        """GRPO's optimizer steps for the groups it would train from this draw; ``groups``: those handed in."""
        args = self.args
        return num_optimizer_steps(
            args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.batch_size,
            self._step_groups(ctx, groups), self.dppo.short_batch == "train", effective_dp_size(args),
        )  # fmt: skip

    def _step_groups(self, ctx: StepContext, accepted: int) -> int:
        """The groups GRPO would train from this draw: prompts drawn less the groups dynamic filtering
        dropped; ``accepted`` when the step has no draw record."""
        if ctx.draw is None:
            return accepted
        return ctx.draw.drawn - len(ctx.filtered) // self.args.rollout.n_samples_per_prompt

    def _forward_batches(self, samples, dp: int):
        """The kept samples as forward batches (``split_rollout_samples``' contract; ``forward_partitions``)."""
        if not self.args.train.dynamic_batch_enable:
            return self.split_rollout_samples(samples)
        for i, sample in enumerate(samples):
            sample.index = [i]
        args = self.args
        budget = (args.rollout.max_tokens_per_gpu, args.ds.ring_attn_size, args.ds.tensor_parallel_size)
        parts = forward_partitions([int(s.total_length.item()) for s in samples], budget, dp)
        pad = self.tokenizer.pad_token_id
        return [Experience.concat_experiences([samples[i] for i in part], pad) for part in parts]

    def _normalizers(
        self, ctx: StepContext, tokens: list[int], q: torch.Tensor, mask: torch.Tensor
    ) -> tuple[float, float]:
        """(Z_tok, Z_seq) of the full batch (docs/METHOD.md, "When it is unbiased", condition 3); ``mask``
        is not read."""
        args, G = self.args, self.args.rollout.n_samples_per_prompt
        prompt_tokens = torch.tensor(tokens, dtype=torch.float64).reshape(-1, G).sum(-1)
        w = 1.0 / q
        if args.algo.dynamic_filtering_enable or ctx.draw is None:
            # a filtered subset: Horvitz-Thompson count of the prompts
            n_prompts = float(w.sum())
        else:
            n_prompts = ctx.draw.drawn
        z_seq, _ = full_batch_normalizer(False, n_prompts, G)
        z_tok, _ = full_batch_normalizer(True, n_prompts, G, prompt_weights=w, prompt_tokens=prompt_tokens)
        return z_tok, z_seq

    def _set_advantages(self, experiences, adv_kept, weights_kept, rewards, train_ids) -> dict:
        """Per-token advantages as OpenRLHF's group estimators make them (REINFORCE++-baseline whitened,
        ``_token_stats``), then the weights folded in. Returns the whitening's metrics, if any."""
        args, G = self.args, self.args.rollout.n_samples_per_prompt
        group_std = rewards.std(-1).repeat_interleave(G)[train_ids] if G > 1 else None
        positions = [torch.tensor(exp.index, dtype=torch.long) for exp in experiences]
        for exp, pos in zip(experiences, positions):
            reward = compute_reward(
                adv_kept[pos],
                self.kl_ctl.value,
                exp.kl,
                action_mask=exp.action_mask,
                reward_clip_range=args.reward.clip_range,
            )
            exp.returns = self.get_cumulative_returns(reward, exp.action_mask, 1.0)
            exp.info["return"] = reward.sum(dim=-1)
            exp.info[rd.SAMPLE_WEIGHT] = weights_kept[pos].float()
            if group_std is not None:
                exp.info["group_reward_std"] = group_std[pos]
            exp.kl = None
        metrics: dict = {}
        if args.algo.advantage.estimator in BATCH_WHITENED:
            mean, rstd = self._token_stats(experiences, [weights_kept[pos] for pos in positions])
            metrics = {rd.ADVANTAGE_TOKEN_MEAN: float(mean), rd.ADVANTAGE_TOKEN_RSTD: float(rstd)}
        for exp, pos in zip(experiences, positions):
            adv = exp.returns
            if metrics:
                adv = ((adv.to(torch.float64) - mean) * rstd).to(exp.returns.dtype)
            exp.advantages = fold_weights(adv, weights_kept[pos])
        return metrics

    def _token_stats(self, experiences, weights: list[torch.Tensor]):
        """REINFORCE++-baseline's (m, 1/s) from the trained completions' tokens with their weights 1/(q p)
        (``core.token_whitening``)."""
        values = torch.cat([exp.returns.flatten() for exp in experiences])
        token_w = torch.cat(
            [
                (w.to(exp.action_mask.device, torch.float64)[:, None] * exp.action_mask).flatten()
                for exp, w in zip(experiences, weights)
            ]
        )
        return token_whitening(values, token_w, std_norm=not self.args.algo.advantage.no_std_norm)

    @staticmethod
    def _single_items(experiences) -> list:
        """Single-sample items of the batched experiences, ``index`` kept on these (the step reads it)."""
        items = []
        for exp in experiences:
            index = exp.index
            items.extend(split_experience_batch(exp))
            exp.index = index
        return items


class CPPOExperienceMaker(DPPOExperienceMaker):
    """CPPO (docs/METHOD.md, "The peers: CPPO and GRESO"), biased by design: DPPO's maker with CPPO's
    keep rule (weight 1, no A == 0 drop), the kept completions' normalisers and GRPO's update size on
    them. Every drawn prompt was rolled out (q = 1); no prompt history."""

    def __init__(self, *args, dppo, **kwargs):
        super().__init__(*args, dppo=dppo, history=None, **kwargs)

    def _completion_draw(self, adv_flat: torch.Tensor, prompt_weight: torch.Tensor, dp: int, step: int):
        """(Draw, metrics): the kept mask, its 0/1 inclusion (a rule, no random draw), weight 1 on the kept."""
        if not bool((prompt_weight == 1).all()):
            raise RuntimeError("CPPO rolls out every drawn prompt (q = 1): a pruned prompt reached its maker")
        G = self.args.rollout.n_samples_per_prompt
        mask = cppo_keep_mask(adv_flat.reshape(-1, G), self.dppo.completion_prune_rate).reshape(-1)
        weight = mask.to(torch.float64)
        metrics = {**keep_metrics(completion_mask=mask), **weight_metrics(weight[mask])}
        metrics[rd.COMPLETION_ZERO_ADV_FRAC] = float((adv_flat == 0).double().mean())
        metrics[rd.COMPLETION_ZERO_PROB_FRAC] = 0.0  # no exact A == 0 drop under CPPO
        return Draw(mask, weight.clone(), weight), metrics

    def _normalizers(
        self, ctx: StepContext, tokens: list[int], q: torch.Tensor, mask: torch.Tensor
    ) -> tuple[float, float]:
        """(Z_tok, Z_seq) of the KEPT completions: CPPO's mean over what it trains."""
        kept = mask.nonzero().flatten().tolist()
        return float(sum(tokens[i] for i in kept)), float(len(kept))

    def _optimizer_steps(self, ctx: StepContext, groups: int) -> int:
        """GRPO's update size on the kept completions: their whole ``--train.batch_size`` batches."""
        args, P = self.args, self.dppo.completion_prune_rate
        G = args.rollout.n_samples_per_prompt
        return num_optimizer_steps(
            cppo_prompts(args.rollout.batch_size, P), cppo_kept_per_group(G, P), args.train.batch_size,
            self._step_groups(ctx, groups), self.dppo.short_batch == "train", effective_dp_size(args),
        )  # fmt: skip


def forward_batch_metrics(experiences) -> dict:
    """The step's forward batches (one batched ``Experience`` each) and the tokens of the largest."""
    tokens = [int(torch.as_tensor(e.total_length).sum()) for e in experiences]
    return {rd.FORWARD_BATCHES: float(len(tokens)), rd.FORWARD_TOKENS_MAX: float(max(tokens, default=0))}


class CountingExperienceMaker(RemoteExperienceMaker):
    """GRPO: OpenRLHF's experience maker, nothing pruned; its advantage code runs on float64 rewards (as
    ``core.group_advantages``), the results returned in the rewards' dtype (at least float32)."""

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        dtypes = [torch.promote_types(e.rewards.dtype, torch.float32) for e in experiences]
        for e in experiences:
            e.rewards = e.rewards.to(torch.float64)  # OpenRLHF keeps float64 (it promotes to >= float32)
        experiences = super().compute_advantages_and_returns(experiences)
        for e, dtype in zip(experiences, dtypes):
            e.rewards, e.returns, e.advantages = (t.to(dtype) for t in (e.rewards, e.returns, e.advantages))
            e.info["return"] = e.info["return"].to(dtype)
        return experiences

    def __init__(self, *args, short_batch: str = "drop", **kwargs):
        super().__init__(*args, **kwargs)
        self.short_batch = short_batch

    @torch.no_grad()
    def make_experience_batch(self, rollout_samples):
        experiences = super().make_experience_batch(rollout_samples)
        rollout_samples.ctx.metrics.update(forward_batch_metrics(experiences))
        mark_short_batch_rule(experiences, self.short_batch == "train")  # read by the actors' buffer
        rollout_samples.ctx.add({rd.SAMPLES_PRUNED: 0, rd.TOKENS_PRUNED: 0})
        return experiences
