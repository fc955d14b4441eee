"""The trainer actor (single controller): OpenRLHF's ``PPOTrainer`` with DPPO's parts; the step in order is
docs/DESIGN.md's "One training step". ``DPPOSteps`` is what it shares with the async training actor.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from openrlhf.trainer import ppo_trainer
from openrlhf.utils.logging_utils import init_logger

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters.dispatch import planned_balance
from openrlhf_dppo.adapters.experience_maker import (
    CountingExperienceMaker,
    CPPOExperienceMaker,
    DPPOExperienceMaker,
)
from openrlhf_dppo.adapters.samples_generator import DPPOSamplesGenerator
from openrlhf_dppo.adapters.step import (
    DPPO_STATE,
    RewardError,
    check_accounting,
    effective_dp_size,
    planned_steps,
    remote_like,
    response_tokens,
    rollout_stats,
    swap_attr,
    unwrap_actor_class,
)
from openrlhf_dppo.core import DPPOConfig
from openrlhf_dppo.run_dir import RunDir, RunMeta

logger = init_logger(__name__)
DRAW_STATE_METHODS = ("dppo", "greso")
PLANNED_METHODS = ("dppo", "cppo")

_BasePPOTrainer: Any = ppo_trainer.BasePPOTrainer


class DPPOSteps(_BasePPOTrainer):
    """What the sync trainer and the async training actor share: ``train_step``, the run directory and the
    DPPO state in the checkpoints. Listed before OpenRLHF's trainer class, so ``super()`` reaches it.
    Hooks: ``_observe_rates``, ``dppo_state_dict``."""

    def _open_run(self, args, dppo: DPPOConfig, run: RunMeta, planned_steps: int) -> None:
        """The run directory and run_config.json (``--dppo.run_dir``, else ``--ckpt.output_dir``)."""
        self.dppo = dppo
        self.step_limit = run.max_steps
        run_path = run.run_dir or args.ckpt.output_dir
        shown_max = self.step_limit if self.step_limit is not None else planned_steps
        self.run_dir = RunDir(os.path.abspath(run_path), max_steps=shown_max)
        self.run_dir.write_config(args, dppo, dppo.method, run.argv, run.start_time, machine=run.machine)
        self._last_step = 0  # the last step trained (from the checkpoint on a resume)

    def _make_experience_maker(self, history):
        """The method's maker; ``history``: the one DPPO's updates (None where the generator keeps it)."""
        maker_args = (self.actor_model_group, self.critic_model_group, self.reward_model_group,
                      self.reference_model_group, self.kl_ctl, self.strategy, self.tokenizer)  # fmt: skip
        if self.dppo.method == "cppo":
            return CPPOExperienceMaker(*maker_args, dppo=self.dppo)
        if self.dppo.method == "dppo":
            return DPPOExperienceMaker(*maker_args, dppo=self.dppo, history=history)
        return CountingExperienceMaker(*maker_args, short_batch=self.dppo.short_batch)

    def _observe_rates(self, stats: dict) -> None:
        raise NotImplementedError

    def train_step(self, rollout_samples, global_step):
        """rollout_samples: the generator's ``Rollouts`` (the step's context in ``.ctx``)."""
        ctx = rollout_samples.ctx
        G = self.args.rollout.n_samples_per_prompt
        rolled_out = list(rollout_samples) + ctx.filtered
        stats = rollout_stats(rolled_out, G, ctx)
        if self.dppo.method in PLANNED_METHODS:  # OpenRLHF calls balance_experiences by its global name
            with swap_attr(ppo_trainer, "balance_experiences", planned_balance):
                status, step = super().train_step(rollout_samples, global_step)
        elif len(rollout_samples) < effective_dp_size(self.args):
            status, step = self._unspread_step(rollout_samples, global_step)
        else:
            status, step = super().train_step(rollout_samples, global_step)
        if stats is not None:  # the raw rewards (OpenRLHF's statistics follow the length penalties)
            status.update(stats)
            if self.dppo.method == "dppo":  # zero-share rate control: the next draws' rate comes from it
                self._observe_rates(stats)
        elif rd.REWARD_MEAN in status:  # a reward model scored the batch: OpenRLHF's statistics, q = 1
            status[rd.REWARD_HT] = status[rd.REWARD_MEAN]
        status.update(ctx.metrics)
        check_accounting(status)
        return status, step

    def _unspread_step(self, rollout_samples, global_step):
        """GRPO: a batch of fewer rollouts than data-parallel ranks, which OpenRLHF cannot spread, goes to no
        rank: counted as untrained, with a warning. Returns (status, step) as OpenRLHF's ``train_step``."""
        n, tokens = float(len(rollout_samples)), float(sum(map(response_tokens, rollout_samples)))
        logger.warning(
            f"step {global_step + 1}: {int(n)} rollouts, fewer than the {effective_dp_size(self.args)} "
            "data-parallel ranks, cannot be spread over them: not trained (counted as samples|tokens/untrained)"
        )
        status = {rd.SAMPLES_TRAINED: 0.0, rd.TOKENS_TRAINED: 0.0, rd.SAMPLES_FILLERS: 0.0, rd.TOKENS_FILLERS: 0.0,
                  rd.SAMPLES_PRUNED: 0.0, rd.TOKENS_PRUNED: 0.0, rd.SAMPLES_UNTRAINED: n, rd.TOKENS_UNTRAINED: tokens}  # fmt: skip
        return status, global_step + 1

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        logs_dict = {} if logs_dict is None else logs_dict
        total = logs_dict.get(rd.STEP_TOTAL)
        if total and rd.TOKENS_GENERATED in logs_dict:
            logs_dict[rd.TOKENS_PER_SEC] = logs_dict[rd.TOKENS_GENERATED] / total
        if logs_dict:
            self.run_dir.log("train", global_step, logs_dict)
        if (
            client_states is not None
            and self.dppo.method in DRAW_STATE_METHODS
            and DPPO_STATE not in client_states
        ):
            client_states[DPPO_STATE] = self.dppo_state_dict()
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self._last_step = global_step
        self.run_dir.status("running", global_step)

    def _record_eval(self, global_step: int, logs: dict) -> None:
        self.run_dir.log("eval", global_step, logs)

    def _resume_run(self, states: dict) -> None:
        """The run directory after OpenRLHF's checkpoint states were read (``global_step`` 0: a fresh run)."""
        self.run_dir.resume(states["global_step"])  # one metrics line per step after a resume
        # never 0 after a resume (the launcher reads it while a requeued job restarts)
        self._last_step = int(states.get("global_step", 0))
        self.run_dir.status("running", self._last_step)

    def _recorded_fit(self, fit, *args, **kwargs) -> None:
        """Runs ``fit`` and writes the run's final status: "finished" (with why if the prompts ran out
        before ``--dppo.max_steps``), or the stop's (``run_dir.ended_by``) before re-raising."""
        try:
            fit(*args, **kwargs)
        except BaseException as err:  # a stop: "interrupted", not final (the launcher records why)
            state, why = rd.ended_by(err, launched=os.environ.get(rd.LAUNCHED_ENV) == "1")
            self.run_dir.status(state, self._last_step, reason=why)
            raise
        reason = None
        if self.step_limit is not None and self._last_step < self.step_limit:
            reason = (
                f"the prompt data ran out after {self._last_step} of --dppo.max_steps {self.step_limit} steps; "
                "raise --train.num_episodes"
            )
            logger.warning(reason)
        self.run_dir.status("finished", self._last_step, reason=reason)


# The class behind the host's Ray actor, typed Any to be a base for mypy.
_PPOTrainerBase: Any = unwrap_actor_class(ppo_trainer.PPOTrainer)


class _DPPOTrainer(DPPOSteps, _PPOTrainerBase):
    """The synchronous trainer: the generator (prompt draws, history, rate control) lives in this actor."""

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, dppo: DPPOConfig, run: RunMeta,
                 **generate_kwargs):  # fmt: skip
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
        """A step whose draw ran the prompt data out ends its episode: its checkpoint names the next one
        (else a resume would replay a whole epoch under the old episode's number)."""
        if client_states is not None and getattr(self.samples_generator, "_dataloader_iter", None) is None:
            client_states["episode"] += 1
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    def init_checkpoint_states(self):
        """OpenRLHF's checkpoint states, read once per run (``fit`` needs them before OpenRLHF's loop)."""
        if self._checkpoint_states is None:
            states = super().init_checkpoint_states()
            if self.dppo.method in DRAW_STATE_METHODS and DPPO_STATE in states:
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
