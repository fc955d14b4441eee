"""Prompt pruning (METHOD.md "Level 1") in OpenRLHF's samples generator, before vLLM sees the prompts.

Seams:
- ``generate_samples`` (owned, short): one step's rollouts are ONE prompt draw, rolled out and returned
  whole. OpenRLHF's version keeps a buffer and serves whatever exceeds ``rollout.batch_size x
  n_samples_per_prompt`` at the next step without a new draw; with ``--dppo.prompt_batch refill`` a draw
  keeps more than B prompts while most are unseen (unseen prompts keep q = 1, e.g. all of epoch 1), and
  those rollouts would be trained a step late, by the next policy, under the old draw's normaliser. Here
  there is no buffer: a refill step rolls out every kept prompt of its draw (about B once the history
  knows the prompts, up to floor(B / (1 - r_q)) before), with that draw's normalisers.
- ``_generate_vllm``, for the TRAINING dataloader iterator only (evaluation prompts are never pruned and
  take the parent path unchanged):

1. draws the step's prompt batch from the dataloader (B = ``--rollout.batch_size`` prompts with
   ``--dppo.prompt_batch shrink``; floor(B / (1 - r_q)) with ``refill``, so that about B are rolled out),
2. scores them with the prompt history (keyed by dataset index: the dataloader yields prompt text,
   mapped back to its index once from the ``PromptDataset``; identical texts share one entry),
3. draws the keep mask with ``core.prune_prompts`` (q from the scores, seeded per draw; with
   ``--dppo.prompt_prune_rate 0`` every q is 1),
4. hands ONLY the kept prompts to the parent method, which dispatches them to vLLM exactly as before
   (dynamic filtering included: its replacement prompts come from the dataloader and are kept with q = 1),
5. tags every returned sample with ``PromptDraw(index, q)`` (attribute ``dppo_prompt``) for the
   experience maker, which weights it by 1/q and updates the history from its group's rewards.

``last_draw`` describes the most recent draw (the experience maker's normaliser needs the number of
prompts drawn); ``pop_counts`` returns the prompt counters accumulated since the last call.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call

from openrlhf_dppo.core import prune_prompts, step_generator

PROMPT_ATTR = "dppo_prompt"


@dataclass(frozen=True)
class PromptDraw:
    """Dataset index of a rolled-out prompt and the probability q it was kept with."""

    index: int
    q: float


@dataclass
class DrawRecord:
    drawn: int = 0  # prompts taken from the dataloader (replacements of dynamic filtering included)
    kept: int = 0  # of the first draw, prompts kept by the pruning mask
    rolled_out: int = 0  # prompts sent to vLLM
    metrics: dict = field(default_factory=dict)


class DPPOSamplesGenerator(SamplesGenerator):
    def __init__(self, *args, dppo, history, **kwargs):
        super().__init__(*args, **kwargs)
        self.dppo = dppo
        self.history = history
        self.draws = 0  # draws made so far: the seed stream of the next draw (checkpointed)
        self.last_draw = DrawRecord()
        self._counts = {"prompts/drawn": 0, "prompts/rolled_out": 0, "prompts/pruned": 0}
        dataset = self.prompts_dataloader.dataset
        self.prompt_index: dict[str, int] = {}
        for i, prompt in enumerate(dataset.prompts):
            self.prompt_index.setdefault(prompt, i)

    def pop_counts(self) -> dict:
        counts, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        return {k: float(v) for k, v in counts.items()}

    @torch.no_grad()
    def generate_samples(self, **generate_kwargs):
        """(rollouts of one prompt draw, filter pass rate or None, prompts consumed, exhausted)."""
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
        keep = 1.0 - self.dppo.prompt_prune_rate
        if self.dppo.prompt_batch == "refill" and keep < 1.0:
            return max(num_prompts, math.floor(num_prompts / keep + 1e-9))
        return num_prompts

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        if dataloader_iter is not getattr(self, "_dataloader_iter", None):
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)

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
        record = DrawRecord(drawn=len(prompts), kept=len(kept), metrics=metrics)
        self.last_draw = record

        experiences, consumed = [], 0
        if kept:
            batches = [([None], [prompts[k]], [labels[k]], [images[k]]) for k in kept]
            experiences, consumed, more_exhausted = super()._generate_vllm(
                itertools.chain(batches, dataloader_iter), len(kept), dynamic_filtering, **generate_kwargs
            )
            exhausted = exhausted or more_exhausted
        replacements = max(consumed - len(kept), 0)
        record.drawn += replacements
        record.rolled_out = len(kept) + replacements
        self._counts["prompts/drawn"] += record.drawn
        self._counts["prompts/rolled_out"] += record.rolled_out
        self._counts["prompts/pruned"] += len(prompts) - len(kept)

        tags = {prompts[k]: PromptDraw(int(index[k]), float(draw.prob[k])) for k in kept}
        for exp in experiences:
            prompt = exp.prompts[0]
            setattr(exp, PROMPT_ATTR, tags.get(prompt) or PromptDraw(self.prompt_index[prompt], 1.0))
        return experiences, record.drawn, exhausted
