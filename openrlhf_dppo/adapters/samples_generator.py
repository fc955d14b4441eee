"""The step's rollouts: prompt pruning (METHOD.md "Level 1") before vLLM sees the prompts, and what the
step's accounting needs from generation. Used for DPPO and, observing only, for ``--dppo.enable false``.

Seams (``OpenRLHF SamplesGenerator``):
- ``generate_samples(ctx)``: the trainer hands each step's ``StepContext`` (``adapters.step``).
  * DPPO (owned, short): ONE prompt draw, rolled out and returned whole. OpenRLHF's version keeps a
    buffer and serves whatever exceeds ``rollout.batch_size x n_samples_per_prompt`` at the next step
    without a new draw; with ``--dppo.prompt_batch refill`` a draw keeps more than B prompts while most
    are unseen (unseen prompts keep q = 1, e.g. all of epoch 1), and those rollouts would be trained a
    step late, by the next policy, under the old draw's normaliser. Here there is no buffer: a refill
    step rolls out every kept prompt of its draw (about B once the history knows the prompts, up to
    floor(B / (1 - r_q)) before), with that draw's normalisers.
  * GRPO: OpenRLHF's method unchanged (its buffer included).
  Counts ``samples|tokens/generated`` (the rollouts returned for the step plus those dynamic filtering
  dropped while generating them), ``samples|tokens/filtered`` and ``prompts/drawn|rolled_out|pruned``.
- ``_generate_vllm``, for the TRAINING dataloader iterator only (evaluation prompts take the parent path
  unchanged and are never pruned). DPPO:
  1. draws the step's prompt batch from the dataloader (B = ``--rollout.batch_size`` prompts with
     ``shrink``; floor(B / (1 - r_q)) with ``refill``, so that about B are rolled out),
  2. scores them with the prompt history (keyed by dataset index: the dataloader yields prompt text,
     mapped back to its index once from the ``PromptDataset``; identical texts share one entry),
  3. draws the keep mask with ``core.prune_prompts`` (q from the scores, seeded per draw; with
     ``--dppo.prompt_prune_rate 0`` every q is 1),
  4. hands ONLY the kept prompts to the parent method, which dispatches them to vLLM exactly as before
     (dynamic filtering included: its replacement prompts come from the dataloader and keep q = 1).
  Both arms: the groups OpenRLHF's dynamic filter dropped (every response of the call is seen, see
  below; the dropped ones are those not returned) go to ``ctx.filtered``: the history must see them,
  and they were generated.
- ``_process_response_into_experience`` (every vLLM response, training and evaluation): a reward
  function that raised (OpenRLHF's executor then leaves the reward empty) or returned NaN / inf stops
  the run with a ``RewardError`` naming the reward file and the step, before any filter or training
  sees the value. Training rollouts are tagged ``PromptDraw(index, q)`` (``PROMPT_ATTR``): the
  experience maker weights them by 1/q and updates the history from their groups.
"""

from __future__ import annotations

import itertools

import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters.step import PROMPT_ATTR, DrawRecord, PromptDraw, StepContext
from openrlhf_dppo.core import prune_prompts, step_generator


class RewardError(RuntimeError):
    """The reward function gave no finite reward for a rollout."""


def response_tokens(sample) -> int:
    return int(sample.action_mask.sum().item())


class DPPOSamplesGenerator(SamplesGenerator):
    def __init__(self, *args, dppo, history=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.dppo = dppo
        self.history = history  # PromptHistory (DPPO) or None
        self.draws = 0  # prompt draws made so far: the seed stream of the next draw (checkpointed)
        # --reward.remote_url is a list (files or URLs); --train.agent_func_path one file
        source = self.args.reward.remote_url or self.args.train.agent_func_path
        self.reward_source = ", ".join(source) if isinstance(source, (list, tuple)) else source
        self.prompt_index: dict[str, int] = {}
        for i, prompt in enumerate(self.prompts_dataloader.dataset.prompts):
            self.prompt_index.setdefault(prompt, i)
        self._ctx: StepContext | None = None  # the step being generated (within generate_samples)
        self._seen: list | None = None  # every training response of the current _generate_vllm call
        self._q: dict[str, float] = {}  # prompt text -> q of the current draw's kept prompts

    # ---- one step ---------------------------------------------------------------------------------
    @torch.no_grad()
    def generate_samples(self, ctx: StepContext, **generate_kwargs):
        """(rollouts of the step, filter pass rate or None, prompts consumed, exhausted), as OpenRLHF's."""
        before = len(ctx.filtered)
        self._ctx = ctx
        try:
            if self.dppo.enable:
                out = self._one_draw(**generate_kwargs)
            else:
                out = super().generate_samples(**generate_kwargs)
        finally:
            self._ctx = None
        samples, consumed = out[0], out[2]
        filtered = ctx.filtered[before:]
        filtered_tokens = sum(map(response_tokens, filtered))
        ctx.add({
            rd.SAMPLES_GENERATED: len(samples) + len(filtered),
            rd.TOKENS_GENERATED: sum(map(response_tokens, samples)) + filtered_tokens,
            rd.SAMPLES_FILTERED: len(filtered),
            rd.TOKENS_FILTERED: filtered_tokens,
        })  # fmt: skip
        if not self.dppo.enable:
            ctx.add({rd.PROMPTS_DRAWN: consumed, rd.PROMPTS_ROLLED_OUT: consumed, rd.PROMPTS_PRUNED: 0})
        return out

    def _one_draw(self, **generate_kwargs):
        """DPPO's step: one prompt draw through vLLM, returned whole (no carry-over buffer: see above)."""
        args = self.args
        if getattr(self, "_dataloader_iter", None) is None:  # a new epoch over the prompts
            self._dataloader_iter = iter(self.prompts_dataloader)
        if args.vllm.enable_sleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        try:
            experiences, consumed, exhausted = self._generate_vllm(
                self._dataloader_iter,
                args.rollout.batch_size,
                dynamic_filtering=args.algo.dynamic_filtering_enable,
                **generate_kwargs,
            )
        finally:
            if args.vllm.enable_sleep:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        pass_rate = None
        if args.algo.dynamic_filtering_enable and consumed:
            pass_rate = len(experiences) / consumed * 100  # OpenRLHF's definition (samples per prompt, %)
        if exhausted:
            self._dataloader_iter = None
        return experiences, pass_rate, consumed, exhausted

    def _n_draw(self, num_prompts: int) -> int:
        return self.dppo.prompts_drawn(num_prompts)

    # ---- vLLM: pruning and what the filter dropped -----------------------------------------------
    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        ctx = self._ctx
        if ctx is None or dataloader_iter is not getattr(self, "_dataloader_iter", None):
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        self._seen = []
        try:
            if self.dppo.enable:
                out = self._pruned_generate(
                    ctx, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs
                )
            else:
                out = super()._generate_vllm(
                    dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs
                )
            seen = self._seen
        finally:
            self._seen, self._q = None, {}
        returned = {id(e) for e in out[0]}
        ctx.filtered.extend(e for e in seen if id(e) not in returned)  # what OpenRLHF's filter dropped
        return out

    def _pruned_generate(self, ctx, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs):
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, self._n_draw(num_prompts))
        if not prompts:
            return [], 0, True
        index = torch.tensor([self.prompt_index[p] for p in prompts], dtype=torch.int64)
        scores = self.history.score(index, group_size=self.args.rollout.n_samples_per_prompt)
        cfg = self.dppo
        draw, metrics = prune_prompts(
            scores,
            1.0 - cfg.prompt_prune_rate,
            cfg.q_min,
            cfg.sampling,
            step_generator(cfg.seed, self.draws, 0),
        )
        self.draws += 1
        kept = draw.mask.nonzero().flatten().tolist()
        self._q = {prompts[k]: float(draw.prob[k]) for k in kept}
        experiences, consumed = [], 0
        if kept:
            batches = [([None], [prompts[k]], [labels[k]], [images[k]]) for k in kept]
            experiences, consumed, more_exhausted = super()._generate_vllm(
                itertools.chain(batches, dataloader_iter), len(kept), dynamic_filtering, **generate_kwargs
            )
            exhausted = exhausted or more_exhausted
        replacements = max(consumed - len(kept), 0)
        ctx.draw = DrawRecord(
            drawn=len(prompts) + replacements, kept=len(kept), rolled_out=len(kept) + replacements
        )
        ctx.metrics.update(metrics)
        ctx.add({
            rd.PROMPTS_DRAWN: ctx.draw.drawn,
            rd.PROMPTS_ROLLED_OUT: ctx.draw.rolled_out,
            rd.PROMPTS_PRUNED: len(prompts) - len(kept),
        })  # fmt: skip
        return experiences, ctx.draw.drawn, exhausted

    def _process_response_into_experience(self, response, **generate_kwargs):
        exp = super()._process_response_into_experience(response, **generate_kwargs)
        self._check_reward(exp)
        if self._seen is not None:  # a training rollout of the current step
            prompt = exp.prompts[0]
            setattr(exp, PROMPT_ATTR, PromptDraw(self.prompt_index[prompt], self._q.get(prompt, 1.0)))
            self._seen.append(exp)
        return exp

    def _check_reward(self, exp) -> None:
        if not self.reward_source:  # a reward model scores the rollouts later
            return
        where = f"at step {self._ctx.step}" if self._ctx is not None else "during the evaluation"
        prompt = exp.prompts[0]
        if exp.rewards is None:
            raise RewardError(
                f"{self.reward_source}: no reward for a rollout of prompt {prompt!r} {where}. The reward "
                "function raised or returned nothing (OpenRLHF's executor logs the exception as "
                "'[SingleTurnExecutor] Failed to fetch reward' in the vLLM engine's log)."
            )
        values = [exp.rewards] + ([exp.scores] if exp.scores is not None else [])
        if not all(torch.isfinite(torch.as_tensor(v, dtype=torch.float64)).all() for v in values):
            raise RewardError(
                f"{self.reward_source} returned a non-finite reward {exp.rewards.tolist()} (scores "
                f"{None if exp.scores is None else exp.scores.tolist()}) for a rollout of prompt {prompt!r} "
                f"{where}; training on it would make the loss NaN"
            )
