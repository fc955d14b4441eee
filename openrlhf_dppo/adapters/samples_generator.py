"""The step's rollouts (``DPPOSamplesGenerator``), both arms: prompt pruning before vLLM sees the prompts
(docs/METHOD.md, "Prompt keep probabilities") and the counts the step's accounting needs from generation.

- ``generate_samples()``: one ``StepContext`` per step, returned on ``Rollouts``; "exhausted" once
  ``--dppo.max_steps`` steps were handed out. DPPO: ONE prompt draw per step, rolled out and returned
  whole (OpenRLHF's carry-over buffer is not used); the draw never keeps nothing (a redraw would
  condition the step on a non-empty draw). GRPO: OpenRLHF's method, observed. CPPO: int(B / (1 - P))
  prompts, all rolled out (q = 1). GRESO: every prompt skipped before vLLM with probability 1 - its
  keep probability.
- ``_generate_vllm``: a training call carries the context as the ``dppo_step`` generate kwarg; the groups
  dynamic filtering dropped go to ``ctx.filtered``. Evaluation calls are never pruned.
- ``_process_response_into_experience``: a missing or non-finite reward raises ``RewardError``.
"""

from __future__ import annotations

import itertools

import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.logging_utils import init_logger

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters.step import (
    DrawRecord,
    PromptDraw,
    RewardError,
    Rollouts,
    StepContext,
    response_tokens,
)
from openrlhf_dppo.core import (
    Draw,
    PromptHistory,
    PromptRateControl,
    keep_metrics,
    prune_prompts,
    step_generator,
)
from openrlhf_dppo.core.cppo import cppo_prompts
from openrlhf_dppo.core.greso import GresoController, GresoStreaks, greso_keep_probs, greso_shares

logger = init_logger(__name__)


class DPPOSamplesGenerator(SamplesGenerator):
    def __init__(self, *args, dppo, history=None, step_limit: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.dppo = dppo
        if history is None and dppo.method == "dppo":  # DPPO's prompt history over the dataset, unless given
            history = PromptHistory(len(self.prompts_dataloader.dataset))
        self.history = history  # PromptHistory (DPPO) or None
        self.step_limit = step_limit  # --dppo.max_steps (None: OpenRLHF's episodes decide)
        self.steps = 0  # steps whose rollouts were handed out (the trainer sets it on a resume)
        self.draws = 0  # prompt draws made so far: the seed stream of the next draw (checkpointed)
        self.rate_control = PromptRateControl.from_config(dppo)  # r_q of each draw (checkpointed)
        # GRESO's streaks and p_easy / p_hard (checkpointed); None unless --dppo.method greso
        greso = dppo.method == "greso"
        self.streaks = GresoStreaks(len(self.prompts_dataloader.dataset)) if greso else None
        self.greso_control = GresoController() if greso else None
        # --reward.remote_url is a list (files or URLs); --train.agent_func_path one file
        source = self.args.reward.remote_url or self.args.train.agent_func_path
        self.reward_source = ", ".join(source) if isinstance(source, (list, tuple)) else source
        self.prompt_index: dict[str, int] = {}
        for i, prompt in enumerate(self.prompts_dataloader.dataset.prompts):
            self.prompt_index.setdefault(prompt, i)

    def dppo_state_dict(self) -> dict:
        """The draw state for the checkpoint's client states (DPPO's or GRESO's), with the config."""
        if self.dppo.method == "greso":
            return {
                "method": "greso",
                "greso_streaks": self._greso()[0].state_dict(),
                "greso_control": self._greso()[1].state_dict(),
                "draws": self.draws,
                "config": self.dppo.asdict(),
            }
        return {
            "history": self._history().state_dict(),
            "draws": self.draws,
            "rate_control": self.rate_control.state_dict(),
            "config": self.dppo.asdict(),
        }

    def load_dppo_state(self, state: dict) -> None:
        saved = state.get("method", "dppo")  # states written before GRESO are DPPO's
        if saved != self.dppo.method:
            raise ValueError(
                f"the checkpoint's draw state is a {saved} run's, this run's --dppo.method is "
                f"{self.dppo.method}: resume with the same --dppo.method"
            )
        if saved == "greso":
            streaks, control = self._greso()
            streaks.load_state_dict(state["greso_streaks"])
            control.load_state_dict(state["greso_control"])
            self.draws = int(state["draws"])
            logger.info(f"GRESO state restored: {streaks.capacity} prompts, {self.draws} draws")
            return
        history = self._history()
        history.load_state_dict(state["history"])
        self.draws = int(state["draws"])
        if "rate_control" in state:  # checkpoints written before the rate control have none (fixed rate)
            self.rate_control.load_state_dict(state["rate_control"])
        logger.info(f"DPPO state restored: {history.capacity} prompts, {state['draws']} draws")

    def _history(self):
        """The prompt history (DPPO only)."""
        if self.history is None:
            raise RuntimeError("no DPPO state without a prompt history: DPPO is off (--dppo.method grpo)")
        return self.history

    def _greso(self) -> tuple[GresoStreaks, GresoController]:
        if self.streaks is None or self.greso_control is None:
            raise RuntimeError("no GRESO state: --dppo.method is not greso")
        return self.streaks, self.greso_control

    @torch.no_grad()
    def generate_samples(self, **generate_kwargs):
        """(Rollouts with the step's StepContext, filter pass rate or None, prompts consumed, exhausted), as
        OpenRLHF's; "exhausted" with nothing once ``--dppo.max_steps`` steps were made."""
        if self.step_limit is not None and self.steps >= self.step_limit:
            return Rollouts(), None, 0, True
        ctx = StepContext(step=self.steps + 1)
        if self.dppo.method in ("dppo", "greso", "cppo"):
            samples, pass_rate, consumed, exhausted = self._one_draw(ctx, **generate_kwargs)
        else:
            samples, pass_rate, consumed, exhausted = super().generate_samples(
                dppo_step=ctx, **generate_kwargs
            )
            ctx.add({rd.PROMPTS_DRAWN: consumed, rd.PROMPTS_ROLLED_OUT: consumed, rd.PROMPTS_PRUNED: 0})
            for sample in samples:  # a rollout OpenRLHF's buffer kept from an earlier call is tagged here
                ctx.prompts.setdefault(
                    sample.prompts[0], PromptDraw(self.prompt_index[sample.prompts[0]], 1.0)
                )
        filtered_tokens = sum(map(response_tokens, ctx.filtered))
        ctx.add({
            rd.SAMPLES_GENERATED: len(samples) + len(ctx.filtered),
            rd.TOKENS_GENERATED: sum(map(response_tokens, samples)) + filtered_tokens,
            rd.SAMPLES_FILTERED: len(ctx.filtered),
            rd.TOKENS_FILTERED: filtered_tokens,
        })  # fmt: skip
        if samples:
            self.steps += 1
        return Rollouts(samples, ctx), pass_rate, consumed, exhausted

    def _one_draw(self, ctx: StepContext, **generate_kwargs):
        """One prompt draw through vLLM, returned whole (DPPO, CPPO, GRESO)."""
        args = self.args
        if getattr(self, "_dataloader_iter", None) is None:  # a new epoch over the prompts
            self._dataloader_iter = iter(self.prompts_dataloader)
        if args.vllm.enable_sleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        generate = self._greso_generate if self.dppo.method == "greso" else self._pruned_generate
        num_prompts = args.rollout.batch_size
        if self.dppo.method == "cppo":  # CPPO draws int(B / (1 - P)) prompts and rolls every one out
            num_prompts = cppo_prompts(num_prompts, self.dppo.completion_prune_rate)
        try:
            experiences, consumed, exhausted = generate(
                ctx, num_prompts, args.algo.dynamic_filtering_enable, **generate_kwargs
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

    def _pruned_generate(self, ctx: StepContext, num_prompts: int, dynamic_filtering, **generate_kwargs):
        prompts, labels, images, exhausted = _collect_prompt_batch(self._dataloader_iter, num_prompts)
        if not prompts:
            return [], 0, True
        index = torch.tensor([self.prompt_index[p] for p in prompts], dtype=torch.int64)
        G = self.args.rollout.n_samples_per_prompt
        cfg = self.dppo
        if cfg.method == "cppo":  # every drawn prompt rolled out (q = 1): no history, no draw stream
            ones = torch.ones(len(prompts), dtype=torch.float64)
            draw, metrics, rate = Draw(ones.bool(), ones, ones), keep_metrics(prompt_mask=ones.bool()), 0.0
        else:
            signals = self.history.signals(index, G)
            rate = self.rate_control.rate()  # from earlier steps only: fixed before this rollout
            draw, metrics = prune_prompts(
                signals.score, 1.0 - rate, cfg.q_min, step_generator(cfg.seed, self.draws, 0),
                policy=cfg.prompt_policy, unseen=signals.unseen,
            )  # fmt: skip
            self.draws += 1
        kept = draw.mask.nonzero().flatten().tolist()
        if not kept:  # a redraw for the same step would bias it
            raise RuntimeError(f"step {ctx.step}: the prompt draw kept no prompt; prune_prompts must not")
        ctx.prompts.update({prompts[k]: PromptDraw(int(index[k]), float(draw.prob[k])) for k in kept})
        batches = [([None], [prompts[k]], [labels[k]], [images[k]]) for k in kept]
        experiences, consumed, more_exhausted = self._generate_vllm(
            itertools.chain(batches, self._dataloader_iter),
            len(kept),
            dynamic_filtering,
            dppo_step=ctx,
            **generate_kwargs,
        )
        replacements = max(consumed - len(kept), 0)
        ctx.draw = DrawRecord(
            drawn=len(prompts) + replacements, kept=len(kept), rolled_out=len(kept) + replacements
        )
        ctx.metrics.update(metrics)
        ctx.metrics[rd.PROMPT_PRUNE_RATE_TARGET] = rate
        ctx.add({
            rd.PROMPTS_DRAWN: ctx.draw.drawn,
            rd.PROMPTS_ROLLED_OUT: ctx.draw.rolled_out,
            rd.PROMPTS_PRUNED: len(prompts) - len(kept),
        })  # fmt: skip
        return experiences, ctx.draw.drawn, exhausted or more_exhausted

    def _greso_generate(self, ctx: StepContext, num_prompts: int, dynamic_filtering, **generate_kwargs):
        """GRESO's step (docs/METHOD.md, "The peers: CPPO and GRESO"): every prompt the dataloader yields
        (replacements too) is rolled out with its keep probability (streaks, the step's p_easy / p_hard;
        one Bernoulli draw each from the stream (``--dppo.seed``, draw)), else skipped before vLLM. Then
        every rolled-out group updates the streaks, and from the second pass on the shares move p."""
        streaks, control = self._greso()
        p_easy, p_hard = control.p_easy, control.p_hard
        generator = step_generator(self.dppo.seed, self.draws, 0)
        skipped = [0]

        def drawn_and_kept():
            for datasources, prompts, labels, images in self._dataloader_iter:
                index = torch.tensor([self.prompt_index[p] for p in prompts], dtype=torch.int64)
                keep = greso_keep_probs(*streaks.streaks(index), p_easy, p_hard)
                kept = (torch.rand(len(prompts), generator=generator, dtype=torch.float64) < keep).tolist()
                skipped[0] += kept.count(False)
                for k in (k for k, on in enumerate(kept) if on):
                    ctx.prompts[prompts[k]] = PromptDraw(int(index[k]), float(keep[k]))
                if any(kept):
                    yield tuple(
                        [x for x, on in zip(part, kept) if on]
                        for part in (datasources, prompts, labels, images)
                    )

        experiences, rolled_out, exhausted = self._generate_vllm(
            drawn_and_kept(), num_prompts, dynamic_filtering, dppo_step=ctx, **generate_kwargs
        )
        drawn = rolled_out + skipped[0]
        if drawn:  # a call that found the dataloader empty made no draw
            self.draws += 1
        ctx.draw = DrawRecord(drawn=drawn, kept=rolled_out, rolled_out=rolled_out)
        index, rewards = self._rolled_out_groups(ctx)
        easy, hard = greso_shares(rewards)
        adapted = bool(streaks.seen(index).any())  # the second pass over the prompts (or later)
        streaks.update(index, rewards)
        if adapted:
            control.update(easy, hard)
        ctx.metrics.update({
            rd.GRESO_P_EASY: p_easy, rd.GRESO_P_HARD: p_hard, rd.GRESO_EASY_SHARE: easy,
            rd.GRESO_HARD_SHARE: hard, rd.GRESO_ADAPTED: float(adapted),
        })  # fmt: skip
        ctx.add({rd.PROMPTS_DRAWN: drawn, rd.PROMPTS_ROLLED_OUT: rolled_out, rd.PROMPTS_PRUNED: skipped[0]})
        return experiences, drawn, exhausted

    def _rolled_out_groups(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(dataset index (n,), raw rewards (n, G)) of every group in ``ctx.responses``, by prompt in the
        order their first response came back."""
        G = self.args.rollout.n_samples_per_prompt
        by_prompt: dict[str, list[float]] = {}
        for exp in ctx.responses:
            if exp.rewards is None:
                raise RuntimeError(
                    f"step {ctx.step}: a rollout of {exp.prompts[0]!r} has no reward; GRESO's streaks need the "
                    "rewards at rollout (--reward.remote_url or --train.agent_func_path)"
                )
            by_prompt.setdefault(exp.prompts[0], []).extend(exp.rewards.reshape(-1).tolist())
        index, rows = [], []
        for prompt, rewards in by_prompt.items():
            if len(rewards) % G:
                raise RuntimeError(
                    f"step {ctx.step}: {len(rewards)} rollouts of {prompt!r}, not groups of {G}"
                )
            for k in range(0, len(rewards), G):
                index.append(self.prompt_index[prompt])
                rows.append(rewards[k : k + G])
        return (
            torch.tensor(index, dtype=torch.int64),
            torch.tensor(rows, dtype=torch.float64).reshape(len(rows), G),
        )

    def _generate_vllm(
        self, dataloader_iter, num_prompts: int, dynamic_filtering, dppo_step=None, **generate_kwargs
    ):
        """OpenRLHF's rollout; a training call (``dppo_step``) also records in ``ctx.filtered`` the
        responses not returned (the groups dynamic filtering dropped)."""
        if dppo_step is None:  # evaluation
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        before = len(dppo_step.responses)
        out = super()._generate_vllm(
            dataloader_iter, num_prompts, dynamic_filtering, dppo_step=dppo_step, **generate_kwargs
        )
        returned = {id(e) for e in out[0]}
        dppo_step.filtered.extend(e for e in dppo_step.responses[before:] if id(e) not in returned)
        return out

    def _process_response_into_experience(
        self, response, dppo_step: StepContext | None = None, **generate_kwargs
    ):
        exp = super()._process_response_into_experience(response, **generate_kwargs)
        self._check_reward(exp, dppo_step)
        if dppo_step is not None:  # a training rollout; unpruned prompts (GRPO, replacements) have q = 1
            prompt = exp.prompts[0]
            dppo_step.prompts.setdefault(prompt, PromptDraw(self.prompt_index[prompt], 1.0))
            dppo_step.responses.append(exp)
        return exp

    def _check_reward(self, exp, ctx: StepContext | None) -> None:
        if not self.reward_source:  # a reward model scores the rollouts later
            return
        where = f"at step {ctx.step}" if ctx is not None else "during the evaluation"
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
