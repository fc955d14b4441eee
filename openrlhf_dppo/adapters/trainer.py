"""The trainer actor (single controller): OpenRLHF's ``PPOTrainer`` with the DPPO parts swapped in.

Seams (each overrides one method of ``openrlhf.trainer.ppo_trainer.PPOTrainer`` and calls the parent):
- ``__init__``: with DPPO on, replaces ``samples_generator`` / ``experience_maker`` by the DPPO
  subclasses (same constructor arguments) that share one ``PromptHistory``; writes run_config.json.
- ``train_step``: counts what was generated, and -- DPPO on -- replaces the module-global
  ``balance_experiences`` of ``openrlhf.trainer.ppo_trainer`` for the duration of the parent call by the
  experience maker's packed per-rank dispatch plan; merges the step's DPPO metrics into the status
  (so wandb / tensorboard log them) and checks generated = trained + pruned.
- ``_compute_rollout_stats``: ``rollout/*`` over all rollouts, not only the kept ones.
- ``save_logs_and_checkpoints``: one metrics.jsonl line per step; the DPPO state (prompt history,
  draw counters) goes into the checkpoint's client states; ``init_checkpoint_states`` restores it.
- ``evaluate`` / ``fit``: eval lines and status.json.
With ``--dppo.enable false`` only the run-directory writing is added: every number is GRPO's.
"""

from __future__ import annotations

import os

from openrlhf.trainer import ppo_trainer
from openrlhf.utils.logging_utils import init_logger

from openrlhf_dppo.adapters._ray import remote_like, swap_attr, unwrap_actor_class
from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker, response_tokens
from openrlhf_dppo.adapters.run_dir import RunDir
from openrlhf_dppo.adapters.samples_generator import DPPOSamplesGenerator
from openrlhf_dppo.core import DPPOConfig, PromptHistory

logger = init_logger(__name__)
DPPO_STATE = "dppo_state"


class AccountingError(RuntimeError):
    """Generated tokens/samples do not equal trained + pruned."""


def check_accounting(status: dict) -> None:
    for unit in ("tokens", "samples"):
        gen, trained, pruned = (status.get(f"{unit}/{k}") for k in ("generated", "trained", "pruned"))
        if gen is None or trained is None or pruned is None:
            continue
        if gen != trained + pruned:
            raise AccountingError(f"{unit}: generated {gen} != trained {trained} + pruned {pruned}")


_PPOTrainerBase = unwrap_actor_class(ppo_trainer.PPOTrainer)


class _DPPOTrainer(_PPOTrainerBase):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, **generate_kwargs):  # fmt: skip
        super().__init__(
            pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
            reference_model_group, vllm_engines, **generate_kwargs,
        )  # fmt: skip
        args = strategy.args
        self.dppo = DPPOConfig.from_namespace(args)
        self.history = None
        if self.dppo.enable:
            self.history = PromptHistory(
                len(self.prompts_dataloader.dataset),
                decay=self.dppo.history_decay,
                prior=self.dppo.history_prior,
                reward_kind=self.dppo.reward_kind,
            )
            self.samples_generator = DPPOSamplesGenerator(
                strategy=strategy,
                prompts_dataloader=self.prompts_dataloader,
                eval_dataloader=self.eval_dataloader,
                tokenizer=self.tokenizer,
                vllm_engines=vllm_engines,
                dppo=self.dppo,
                history=self.history,
            )
            self.experience_maker = DPPOExperienceMaker(
                self.actor_model_group,
                self.critic_model_group,
                self.reward_model_group,
                self.reference_model_group,
                self.kl_ctl,
                self.strategy,
                self.tokenizer,
                dppo=self.dppo,
                history=self.history,
            )
        run_path = getattr(args.dppo, "run_dir", None) or args.ckpt.output_dir
        self.run_dir = RunDir(os.path.abspath(run_path), max_steps=self.max_steps)
        self.run_dir.write_config(args, self.dppo, "dppo" if self.dppo.enable else "grpo")
        self._last_step = 0

    # ---- one step -------------------------------------------------------------------------------
    def train_step(self, rollout_samples, global_step):
        counts = {
            "tokens/generated": float(sum(response_tokens(s) for s in rollout_samples)),
            "samples/generated": float(len(rollout_samples)),
        }
        if not self.dppo.enable:
            status, step = super().train_step(rollout_samples, global_step)
            n_prompts = len(rollout_samples) / self.args.rollout.n_samples_per_prompt
            counts.update({
                "tokens/trained": counts["tokens/generated"], "tokens/pruned": 0.0,
                "samples/trained": counts["samples/generated"], "samples/pruned": 0.0,
                "prompts/drawn": n_prompts, "prompts/rolled_out": n_prompts, "prompts/pruned": 0.0,
            })  # fmt: skip
        else:
            maker = self.experience_maker
            maker.step = global_step
            maker.prompt_draw = self.samples_generator.last_draw
            with swap_attr(ppo_trainer, "balance_experiences", self._planned_balance):
                status, step = super().train_step(rollout_samples, global_step)
            counts.update(maker.step_metrics)
            counts.update(self.samples_generator.pop_counts())
            counts.update(self.samples_generator.last_draw.metrics)
        status.update(counts)
        check_accounting(status)
        return status, step

    def _planned_balance(self, experiences, args):
        """Stands in for ``balance_experiences``: the experience maker's per-rank packed plan."""
        plan = self.experience_maker.dispatch
        expected = sum(len(e.sequences) for e in experiences)
        planned = sum(1 for items in plan.rank_items for _ in items) - plan.fillers
        if planned != expected:
            raise RuntimeError(f"DPPO dispatch plan covers {planned} sequences, the batch has {expected}")
        return plan.rank_experiences()

    def _compute_rollout_stats(self, experiences):
        if not self.dppo.enable:
            return super()._compute_rollout_stats(experiences)
        return dict(self.experience_maker.rollout_stats)

    # ---- logs, checkpoints, evaluation -----------------------------------------------------------
    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        logs_dict = {} if logs_dict is None else logs_dict
        total = logs_dict.get("timing/step_total")
        if total and "tokens/generated" in logs_dict:
            logs_dict["perf/tokens_per_sec"] = logs_dict["tokens/generated"] / total
        if logs_dict:
            self.run_dir.log("train", global_step, logs_dict)
        if client_states is not None and self.dppo.enable:
            client_states[DPPO_STATE] = self.dppo_state_dict()
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self._last_step = global_step
        self.run_dir.status("running", global_step)

    def dppo_state_dict(self) -> dict:
        return {
            "history": self.history.state_dict(),
            "draws": self.samples_generator.draws,
            "config": self.dppo.asdict(),
        }

    def load_dppo_state(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self.samples_generator.draws = int(state["draws"])
        logger.info(f"DPPO state restored: {self.history.capacity} prompts, {state['draws']} draws")

    def init_checkpoint_states(self):
        states = super().init_checkpoint_states()
        if self.dppo.enable and DPPO_STATE in states:
            self.load_dppo_state(states[DPPO_STATE])
        # the first status of a (re)start: the step it resumes from (0 for a fresh run), never 0 after a resume
        self._last_step = int(states["global_step"])
        self.run_dir.status("running", self._last_step)
        return states

    def evaluate(self, global_step, **generate_kwargs):
        logs = super().evaluate(global_step, **generate_kwargs)
        self.run_dir.log("eval", global_step, logs)
        return logs

    def fit(self, global_step: int = 0) -> None:
        try:  # the host's fit calls init_checkpoint_states first, which writes the first status
            super().fit(global_step)
        except BaseException:
            self.run_dir.status("failed", self._last_step)
            raise
        self.run_dir.status("finished", self._last_step)


DPPOTrainer = remote_like(ppo_trainer.PPOTrainer, _DPPOTrainer)
