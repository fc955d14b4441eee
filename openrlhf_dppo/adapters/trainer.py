"""The trainer actor (single controller): OpenRLHF's ``PPOTrainer`` with the DPPO parts swapped in.

One step, top to bottom (OpenRLHF's ``fit`` loop; the ``StepContext`` rides on the data, see
``adapters.step``):
1. OpenRLHF's loop calls ``samples_generator.generate_samples()``: the DPPO generator makes the step's
   context and returns ``Rollouts`` with it attached (or "exhausted" once ``--dppo.max_steps`` steps
   were made: that ends every episode loop after the last step's evaluation and checkpoint).
2. OpenRLHF's loop calls ``train_step(rollouts)``: the ``rollout/*`` statistics from the RAW rewards of
   every rolled-out group (with ``rollout/reward_ht``, ``core.reward_stats``), then OpenRLHF's step,
   which hands the same ``rollouts`` to ``experience_maker.make_experience_batch`` and its return to
   ``balance_experiences``: for DPPO that module-global is ``planned_balance`` for the step's duration,
   which follows the plan the maker returned with the experiences. The context's metrics go into the
   status (wandb / tensorboard log them) and generated = trained + pruned + filtered + untrained is
   checked, each count taken where it happens: generated and filtered by the samples generator, pruned
   by the experience maker's mask (GRPO: 0, ``CountingExperienceMaker``), trained by the actors from the
   micro-batches they train (non-zero weight only) and untrained by them from what no step trains, in
   both arms.
   With DPPO the step's all-equal share (``rollout/equal_reward_frac_ht``) goes to the generator's
   ``rate_control`` (``--dppo.prompt_rate_control zero-share`` sets the next draws' prune rate from it).
3. ``save_logs_and_checkpoints``: one metrics.jsonl line per step; the DPPO state (prompt history,
   draw counters, rate control) goes into the checkpoint's client states; ``init_checkpoint_states`` restores it.
The config is the CLI's validated ``DPPOConfig`` and the run metadata (command line, start time,
``--dppo.run_dir``, ``--dppo.max_steps``, ``--dppo.schedule_steps``) the CLI's ``RunMeta``, both passed to
the constructor by ``adapters.install`` (never rebuilt or re-read from the namespace).
Also: ``evaluate`` writes one eval line per evaluation with ``timing/eval`` (seconds); ``fit`` writes
status.json and, for a fresh run (not resumed) with evaluation on, evaluates once before step 1 (step
0). With ``--dppo.enable false`` the generator only observes (counts, reward checks) and OpenRLHF's
experience maker and actor training step run unchanged (the differences are listed in the help of
``--dppo.enable``, ``core.config``). Both arms make a rollout batch's whole train batches of optimizer
steps (``--dppo.short_batch drop``, OpenRLHF's rule: none for a batch smaller than one); what no step
trains (GRPO: also the rest after them) is counted as ``samples|tokens/untrained`` by the actors.
``--dppo.short_batch train`` trains a batch smaller than one train batch (an epoch's short last batch;
every batch when B x G is smaller than one) as one optimizer step in both arms, and the LR schedule spans
those steps (``short_batch_steps``). Under either rule a batch of fewer rollouts than data-parallel ranks
is not trained: GRPO sends it to no rank (OpenRLHF's forwards would stop the run) and counts it as
untrained here (``_unspread_step``); DPPO forwards it with zero-weight copies and its plan makes no step.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch
from openrlhf.trainer import ppo_trainer
from openrlhf.utils.logging_utils import init_logger

from openrlhf_dppo import precision
from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters._ray import remote_like, swap_attr, unwrap_actor_class
from openrlhf_dppo.adapters.dispatch import num_optimizer_steps
from openrlhf_dppo.adapters.experience_maker import (
    CountingExperienceMaker,
    DPPOExperienceMaker,
    effective_dp_size,
)
from openrlhf_dppo.adapters.samples_generator import DPPOSamplesGenerator, RewardError, response_tokens
from openrlhf_dppo.adapters.step import StepContext
from openrlhf_dppo.core import DPPOConfig, reward_stats
from openrlhf_dppo.core.config import DPPOConfigError
from openrlhf_dppo.run_dir import RunDir, RunMeta

logger = init_logger(__name__)
DPPO_STATE = "dppo_state"


class AccountingError(RuntimeError):
    """Generated tokens/samples do not equal trained + pruned + filtered + untrained."""


def check_accounting(status: dict) -> None:
    """Each unit's generated count must equal trained + pruned + filtered + untrained (five counts, each
    taken where it happens: generated and filtered by the samples generator, pruned by the experience
    maker's mask, trained and untrained by the actors from their micro-batches and replay buffers)."""
    parts_of = ("trained", "pruned", "filtered", "untrained")
    for unit in ("tokens", "samples"):
        counts = {k: status.get(f"{unit}/{k}") for k in ("generated", *parts_of)}
        missing = [k for k, v in counts.items() if v is None]
        if missing:
            raise AccountingError(f"{unit}: no count of {', '.join(missing)} for this step")
        parts = {k: v for k, v in counts.items() if v is not None}  # all five, as checked above
        if parts["generated"] != sum(parts[k] for k in parts_of):
            raise AccountingError(
                f"{unit}: generated {parts['generated']} != "
                + " + ".join(f"{k} {parts[k]}" for k in parts_of)
            )


def short_batch_steps(args, prompts: int, rule: str) -> int:
    """The optimizer steps the run makes beyond OpenRLHF's count (``len(prompts) x G // train batch`` per
    episode and PPO epoch): under ``--dppo.short_batch train`` every rollout batch smaller than one train
    batch (an epoch's short last batch; every batch when B x G is smaller than one) makes a step of its
    own, unless it holds fewer rollouts than data-parallel ranks (``dispatch.num_optimizer_steps``), so
    one pass over the prompts can make more steps than OpenRLHF's count; 0 under ``drop``, whose steps
    never exceed it."""
    B, G, T = args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.batch_size
    full, rest = divmod(prompts, B)
    train, dp = rule == "train", effective_dp_size(args)
    made = full * num_optimizer_steps(B, G, T, B, train, dp)
    if rest:
        made += num_optimizer_steps(B, G, T, rest, train, dp)
    return max(0, made - prompts * G // T) * args.train.num_episodes * args.train.max_epochs


def scheduler_steps(args, host_steps: int, step_limit: int | None, span: int | None = None) -> int:
    """The optimizer steps the LR schedule spans (OpenRLHF's ``get_max_steps``): OpenRLHF's count for
    all episodes, or -- with ``--dppo.max_steps`` -- that of the steps the run will make, if fewer; or
    -- with ``--dppo.schedule_steps`` (``span``) -- those of ``span`` training steps, whether or not the
    run makes them (a run cut short keeps the schedule of the longer one). A span shorter than the run
    is refused: past its end the cosine would climb back up."""
    per_step = max(1, args.rollout.batch_size * args.rollout.n_samples_per_prompt // args.train.batch_size)
    run_steps = (
        host_steps if step_limit is None else min(host_steps, step_limit * per_step * args.train.max_epochs)
    )
    if span is None:
        return run_steps
    spanned = span * per_step * args.train.max_epochs
    if spanned < run_steps:
        raise DPPOConfigError(
            "schedule_steps",
            span,
            f"must cover the run: {spanned} optimizer steps, fewer than the run's {run_steps} "
            "(from --train.num_episodes and --dppo.max_steps); past its end the cosine would climb back up",
        )
    return spanned


def planned_steps(args, host_steps: int, prompts: int, dppo: DPPOConfig, run: RunMeta) -> int:
    """The optimizer steps the LR schedule spans for this run: OpenRLHF's count (``host_steps``) plus the
    short batches' steps, cut to ``--dppo.max_steps``, spread to ``--dppo.schedule_steps``
    (``short_batch_steps``, ``scheduler_steps``). prompts: the prompt dataset's length."""
    host_steps += short_batch_steps(args, prompts, dppo.short_batch)
    return scheduler_steps(args, host_steps, run.max_steps, run.schedule_steps)


def rollout_stats(samples, group_size: int, ctx: StepContext) -> dict | None:
    """``rollout/*`` of a step's rolled-out completions (whole groups, in order) from their RAW rewards,
    before any length penalty; None when a reward model scores them later (no rewards on them yet).
    q of a group: its prompt's ``ctx.prompts`` draw (1 when not there: OpenRLHF's buffer served it);
    the prompts drawn: ``ctx.draw`` (None: the groups)."""
    if not samples or any(s.rewards is None for s in samples):
        return None
    rewards = torch.cat([s.rewards.reshape(-1) for s in samples]).to(torch.float64).reshape(-1, group_size)
    tags = [ctx.prompt(s.prompts[0]) for s in samples[::group_size]]
    q = torch.tensor([1.0 if t is None else t.q for t in tags], dtype=torch.float64)
    stats = reward_stats(rewards, q, ctx.draw.drawn if ctx.draw is not None else None)
    stats[rd.RESPONSE_LENGTH_MEAN] = torch.cat([s.response_length for s in samples]).float().mean().item()
    stats[rd.TRUNCATED_RATE] = torch.cat([s.truncated for s in samples]).float().mean().item()
    stats[rd.NUM_SAMPLES] = float(len(samples))
    return stats


def planned_balance(experiences, args):
    """Stands in for OpenRLHF's ``balance_experiences`` during a DPPO step: the per-rank batches of the
    plan the experience maker returned with the experiences (``PlannedExperiences.plan``)."""
    plan = experiences.plan
    expected = sum(len(e.sequences) for e in experiences)
    planned = sum(1 for items in plan.rank_items for _ in items) - plan.fillers
    if planned != expected:
        raise RuntimeError(f"DPPO dispatch plan covers {planned} sequences, the batch has {expected}")
    return plan.rank_experiences()


# OpenRLHF's trainer base, typed Any (the host is untyped; mypy accepts a base computed at run time only so)
_BasePPOTrainer: Any = ppo_trainer.BasePPOTrainer


class DPPOSteps(_BasePPOTrainer):
    """What the sync trainer and the async training actor (``adapters.async_trainer``) share: one step
    (``train_step``: rollout statistics, the DPPO or counting step, the accounting check),
    the run directory and the DPPO state in the checkpoints. Listed before OpenRLHF's trainer class
    (``PPOTrainer``, ``TrainingActor``): ``super()`` reaches its methods, then ``BasePPOTrainer``'s. Hooks:
    ``_observe_rates`` (the all-equal share to the rate control, where the prompts are drawn) and
    ``dppo_state_dict`` (the sync trainer's; the async generator's rides in the client states)."""

    def _open_run(self, args, dppo: DPPOConfig, run: RunMeta, planned_steps: int) -> None:
        """The run directory and run_config.json (``--dppo.run_dir``, else ``--ckpt.output_dir``)."""
        self.dppo = dppo
        self.step_limit = run.max_steps
        run_path = run.run_dir or args.ckpt.output_dir
        shown_max = self.step_limit if self.step_limit is not None else planned_steps
        self.run_dir = RunDir(os.path.abspath(run_path), max_steps=shown_max)
        # the CPU, its bf16 support and the precision: every timing depends on them
        machine = precision.machine(args.ds.param_dtype, run.device)
        self.run_dir.write_config(
            args, dppo, "dppo" if dppo.enable else "grpo", run.argv, run.start_time, machine=machine
        )
        self._last_step = 0  # the last step trained (from the checkpoint on a resume)

    def _make_experience_maker(self, history):
        """DPPO's maker (``history``: the prompt history it updates, or None where the generator keeps it)
        or, with ``--dppo.enable false``, OpenRLHF's with the counts."""
        maker_args = (self.actor_model_group, self.critic_model_group, self.reward_model_group,
                      self.reference_model_group, self.kl_ctl, self.strategy, self.tokenizer)  # fmt: skip
        if self.dppo.enable:
            return DPPOExperienceMaker(*maker_args, dppo=self.dppo, history=history)
        return CountingExperienceMaker(*maker_args, short_batch=self.dppo.short_batch)

    def _observe_rates(self, stats: dict) -> None:
        raise NotImplementedError

    # ---- one step -------------------------------------------------------------------------------
    def train_step(self, rollout_samples, global_step):
        """rollout_samples: the generator's ``Rollouts`` (the step's context in ``.ctx``)."""
        ctx = rollout_samples.ctx
        G = self.args.rollout.n_samples_per_prompt
        rolled_out = list(rollout_samples) + ctx.filtered
        stats = rollout_stats(rolled_out, G, ctx)
        if self.dppo.enable:  # OpenRLHF calls balance_experiences by its module-global name (see adapters)
            with swap_attr(ppo_trainer, "balance_experiences", planned_balance):
                status, step = super().train_step(rollout_samples, global_step)
        elif len(rollout_samples) < effective_dp_size(self.args):
            status, step = self._unspread_step(rollout_samples, global_step)
        else:
            status, step = super().train_step(rollout_samples, global_step)
        if stats is not None:  # the raw rewards (OpenRLHF's statistics follow the length penalties)
            status.update(stats)
            if self.dppo.enable:  # --dppo.prompt_rate_control zero-share sets the next draws' rate from it
                self._observe_rates(stats)
        elif rd.REWARD_MEAN in status:  # a reward model scored the batch: OpenRLHF's statistics, q = 1
            status[rd.REWARD_HT] = status[rd.REWARD_MEAN]
        status.update(ctx.metrics)
        check_accounting(status)
        return status, step

    def _unspread_step(self, rollout_samples, global_step):
        """GRPO: a rollout batch of fewer rollouts than data-parallel ranks (an epoch's short last batch).
        OpenRLHF's forwards and balancing need one rollout per rank (its run stops here). Under
        ``--dppo.short_batch drop`` such a batch is smaller than one train batch, which holds at least one
        rollout per rank, so it is never trained; under ``train`` it cannot be spread over the ranks
        (``dispatch.num_optimizer_steps``; DPPO's plan makes no step of it either). It goes to no rank:
        counted here as untrained, with a warning. Returns (status, step) as OpenRLHF's ``train_step``."""
        n, tokens = float(len(rollout_samples)), float(sum(map(response_tokens, rollout_samples)))
        logger.warning(
            f"step {global_step + 1}: {int(n)} rollouts, fewer than the {effective_dp_size(self.args)} "
            "data-parallel ranks, cannot be spread over them: not trained (counted as samples|tokens/untrained)"
        )
        status = {rd.SAMPLES_TRAINED: 0.0, rd.TOKENS_TRAINED: 0.0, rd.SAMPLES_FILLERS: 0.0, rd.TOKENS_FILLERS: 0.0,
                  rd.SAMPLES_PRUNED: 0.0, rd.TOKENS_PRUNED: 0.0, rd.SAMPLES_UNTRAINED: n, rd.TOKENS_UNTRAINED: tokens}  # fmt: skip
        return status, global_step + 1

    # ---- logs, checkpoints, evaluation -----------------------------------------------------------
    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        logs_dict = {} if logs_dict is None else logs_dict
        total = logs_dict.get(rd.STEP_TOTAL)
        if total and rd.TOKENS_GENERATED in logs_dict:
            logs_dict[rd.TOKENS_PER_SEC] = logs_dict[rd.TOKENS_GENERATED] / total
        if logs_dict:
            self.run_dir.log("train", global_step, logs_dict)
        if client_states is not None and self.dppo.enable and DPPO_STATE not in client_states:
            client_states[DPPO_STATE] = self.dppo_state_dict()
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self._last_step = global_step
        self.run_dir.status("running", global_step)

    def _record_eval(self, global_step: int, logs: dict) -> None:
        self.run_dir.log("eval", global_step, logs)

    def _resume_run(self, states: dict) -> None:
        """The run directory after OpenRLHF's checkpoint states were read (``global_step`` 0: a fresh run)."""
        self.run_dir.resume(states["global_step"])  # one metrics line per step after a resume
        # the first status of a (re)start: the step it resumes from (0 for a fresh run), never 0 after a
        # resume (the launcher reads it while a requeued job restarts)
        self._last_step = int(states.get("global_step", 0))
        self.run_dir.status("running", self._last_step)

    def _recorded_fit(self, fit, *args, **kwargs) -> None:
        """Runs ``fit`` with the run's status: "finished" (with why, when the prompts ran out before
        ``--dppo.max_steps``), or the stop's (``run_dir.ended_by``) before the error goes on."""
        try:
            fit(*args, **kwargs)
        except BaseException as err:  # a stop: "interrupted", not final (the launcher records why)
            state, why = rd.ended_by(err, launched=os.environ.get(rd.LAUNCHED_ENV) == "1")
            self.run_dir.status(state, self._last_step, reason=why)
            raise
        reason = None
        if self.step_limit is not None and self._last_step < self.step_limit:
            # the prompts ran out first (dynamic filtering draws more than a batch per step)
            reason = (
                f"the prompt data ran out after {self._last_step} of --dppo.max_steps {self.step_limit} steps; "
                "raise --train.num_episodes"
            )
            logger.warning(reason)
        self.run_dir.status("finished", self._last_step, reason=reason)


# The Python class behind the host's Ray actor: a class computed at run time, which mypy accepts as a
# base only when typed Any (the host is untyped, so it would be Any to mypy anyway).
_PPOTrainerBase: Any = unwrap_actor_class(ppo_trainer.PPOTrainer)


class _DPPOTrainer(DPPOSteps, _PPOTrainerBase):
    """The synchronous trainer: the generator (prompt draws, history, rate control) lives in this actor."""

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, dppo: DPPOConfig, run: RunMeta,
                 **generate_kwargs):  # fmt: skip
        """OpenRLHF's constructor arguments, plus (keyword-only, from ``adapters.install``) the CLI's
        validated ``DPPOConfig`` and the run's metadata (command line, start time)."""
        super().__init__(
            pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
            reference_model_group, vllm_engines, **generate_kwargs,
        )  # fmt: skip
        args = strategy.args
        self.samples_generator = DPPOSamplesGenerator(
            strategy=strategy, prompts_dataloader=self.prompts_dataloader, eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer, vllm_engines=vllm_engines, dppo=dppo, step_limit=run.max_steps,
        )  # fmt: skip
        self.history = self.samples_generator.history
        self.max_steps: int = planned_steps(
            args, self.max_steps, len(self.prompts_dataloader.dataset), dppo, run
        )
        self._open_run(args, dppo, run, self.max_steps)
        self.experience_maker = self._make_experience_maker(self.history)
        self._checkpoint_states = None

    def _observe_rates(self, stats: dict) -> None:
        self.samples_generator.rate_control.observe(stats[rd.EQUAL_REWARD_FRAC_HT])

    def dppo_state_dict(self) -> dict:
        return self.samples_generator.dppo_state_dict()

    def load_dppo_state(self, state: dict) -> None:
        self.samples_generator.load_dppo_state(state)

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        """A step whose draw ran the prompt data out ends its episode: its checkpoint names the next one.
        OpenRLHF's loop records the episode the step was drawn in, and the dataloader's state after the
        data ran out restarts the data: resumed there, the loop replayed a whole epoch under the old
        episode's number, one epoch more than ``--train.num_episodes``."""
        if client_states is not None and getattr(self.samples_generator, "_dataloader_iter", None) is None:
            client_states["episode"] += 1
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    def init_checkpoint_states(self):
        """OpenRLHF's checkpoint states, read once per run (``fit`` needs them before OpenRLHF's loop)."""
        if self._checkpoint_states is None:
            states = super().init_checkpoint_states()
            if self.dppo.enable and DPPO_STATE in states:
                self.load_dppo_state(states[DPPO_STATE])
            self._resume_run(states)
            self.samples_generator.steps = self._last_step  # the next rollouts are step _last_step + 1
            self._checkpoint_states = states
        return self._checkpoint_states

    def evaluate(self, global_step, **generate_kwargs):
        start = time.time()
        try:
            logs = super().evaluate(global_step, **generate_kwargs)
        except RewardError as err:
            raise RewardError(f"{err} (the evaluation at step {global_step})") from None
        logs[rd.EVAL_TIME] = time.time() - start
        self._record_eval(global_step, logs)
        return logs

    def _evaluation_on(self) -> bool:
        return bool(self.eval_dataloader) and math.isfinite(float(self.args.eval.steps))

    def _eval_generate_kwargs(self) -> dict:
        """The sampling settings OpenRLHF's loop evaluates with."""
        kwargs = dict(self.generate_kwargs)
        kwargs["temperature"] = self.args.eval.temperature
        kwargs["n_samples_per_prompt"] = self.args.eval.n_samples_per_prompt
        return kwargs

    def fit(self, global_step: int = 0) -> None:
        self._recorded_fit(self._fit, global_step)

    def _fit(self, global_step: int) -> None:
        fresh = self.init_checkpoint_states()["global_step"] == 0
        if fresh and self._evaluation_on():
            self.evaluate(0, **self._eval_generate_kwargs())  # the starting point of the curve
        super().fit(global_step)


DPPOTrainer = remote_like(ppo_trainer.PPOTrainer, _DPPOTrainer)
