"""OpenRLHF's asynchronous trainer (``--train.async_enable``) with the DPPO parts, both arms.

``DPPOGenerateSamplesActor`` holds the prompt draw, the history's update, the rate control and the step
limit, and puts the DPPO state into each batch's client states; ``DPPOTrainingActor`` runs the sync
trainer's step (``DPPOSteps``). Unbiased as in sync mode: q is fixed in the generator before the rollout
(docs/METHOD.md, "Departures from the paper", 14).
"""

from __future__ import annotations

import math
import time
from typing import Any

import ray
from openrlhf.trainer import ppo_trainer_async as host
from openrlhf.trainer.ppo_trainer import BasePPOTrainer
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.logging_utils import init_logger
from ray.util.queue import Queue

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters.samples_generator import DPPOSamplesGenerator
from openrlhf_dppo.adapters.step import (
    DPPO_STATE,
    RewardError,
    planned_steps,
    remote_like,
    response_tokens,
    rollout_stats,
    unwrap_actor_class,
    update_history,
)
from openrlhf_dppo.adapters.trainer import DPPOSteps
from openrlhf_dppo.core import DPPOConfig
from openrlhf_dppo.run_dir import RunMeta

logger = init_logger(__name__)

DONE, CLOSED, EVAL = "done", "closed", "eval"

# The classes behind the host's Ray actors, typed Any to be bases for mypy.
_GeneratorBase: Any = unwrap_actor_class(host.GenerateSamplesActor)
_TrainingBase: Any = unwrap_actor_class(host.TrainingActor)
_ControllerBase: Any = unwrap_actor_class(host.PPOTrainerAsync)


class BufferClock:
    """Generation seconds charged to the step that trains the rollouts: a vLLM call's seconds spread
    evenly over the rollouts it returned, which OpenRLHF's buffer (GRPO) may serve at later steps."""

    def __init__(self):
        self.shares: list[float] = []  # seconds of each rollout in OpenRLHF's buffer, in its order

    def serve(self, served: int, held: int, seconds: float) -> float:
        """The seconds of a call's ``served`` rollouts; ``held``: what the buffer keeps after the call."""
        made = served + held - len(self.shares)  # rollouts vLLM returned in this call
        if made > 0:
            self.shares += [seconds / made] * made
            seconds = 0.0
        charged = seconds + sum(self.shares[:served])
        del self.shares[:served]
        return charged

    def drop(self) -> float:
        """The seconds of every rollout still held; none held afterwards."""
        seconds, self.shares = sum(self.shares), []
        return seconds


class _DPPOGenerateSamplesActor(_GeneratorBase):
    """OpenRLHF's generator actor with ``DPPOSamplesGenerator``; DPPO's history and rate control learn
    from each batch right after its rollouts."""

    def __init__(self, pretrain, strategy, vllm_engines, *, vllm_lock, rollout_queue, rollout_slots,
                 final_step, dppo: DPPOConfig, run: RunMeta, **generate_kwargs):  # fmt: skip
        super().__init__(
            pretrain, strategy, vllm_engines, vllm_lock=vllm_lock, rollout_queue=rollout_queue,
            rollout_slots=rollout_slots, **generate_kwargs,
        )  # fmt: skip
        self.dppo, self.final_step = dppo, final_step
        prompts = len(self.prompts_dataloader.dataset)
        host_generator: Any = self.samples_generator  # OpenRLHF's, built by its constructor: its tokenizer
        self.samples_generator: DPPOSamplesGenerator = DPPOSamplesGenerator(
            strategy=strategy, prompts_dataloader=self.prompts_dataloader, eval_dataloader=self.eval_dataloader,
            tokenizer=host_generator.tokenizer, vllm_engines=vllm_engines, dppo=dppo, step_limit=run.max_steps,
        )  # fmt: skip
        self.history = self.samples_generator.history
        host_steps: int = self.max_steps  # OpenRLHF's count
        self.max_steps: int = planned_steps(self.args, host_steps, prompts, dppo, run)

    def restore(self, states: dict) -> None:
        """The checkpoint's generator state (dataloader, DPPO's draw state, steps handed out)."""
        if states.get("data_loader_state_dict"):
            self.prompts_dataloader.load_state_dict(states["data_loader_state_dict"])
        if self.dppo.method == "dppo" and DPPO_STATE in states:
            self.samples_generator.load_dppo_state(states[DPPO_STATE])
        self.samples_generator.steps = int(states.get("global_step", 0))

    def _learn(self, rollouts) -> None:
        """DPPO: the history (shaped rewards, on copies) and the rate control learn from the batch."""
        ctx, G = rollouts.ctx, self.args.rollout.n_samples_per_prompt
        update_history(self.history, ctx, rollouts, self.args)
        stats = rollout_stats(list(rollouts) + ctx.filtered, G, ctx)
        if stats is not None:
            self.samples_generator.rate_control.observe(stats[rd.EQUAL_REWARD_FRAC_HT])

    def _generate(self, clock: BufferClock):
        """(rollouts, filter pass rate, prompts consumed, exhausted, seconds, unserved), under the vLLM lock
        unless partial rollout. unserved: the counts of what OpenRLHF's buffer still holds when this batch
        reaches ``--dppo.max_steps`` (the last step's, as generated and untrained)."""
        partial = self._partial_rollout
        if not partial:
            ray.get(self.vllm_lock.acquire.remote())
        try:
            start = time.time()
            rollouts, *rest = self.samples_generator.generate_samples(**self.generate_kwargs)
            seconds = time.time() - start
        finally:
            if not partial:
                ray.get(self.vllm_lock.release.remote())
        gen = self.samples_generator
        held = getattr(gen, "_sample_buffer", None) or []  # OpenRLHF's buffer (GRPO; DPPO keeps none)
        seconds = clock.serve(len(rollouts), len(held), seconds)
        unserved: dict = {}
        if rollouts and held and gen.step_limit is not None and gen.steps >= gen.step_limit:
            seconds += clock.drop()
            n, tokens = float(len(held)), float(sum(map(response_tokens, held)))
            unserved = {rd.SAMPLES_GENERATED: n, rd.TOKENS_GENERATED: tokens,
                        rd.SAMPLES_UNTRAINED: n, rd.TOKENS_UNTRAINED: tokens}  # fmt: skip
        return (rollouts, *rest, seconds, unserved)

    def _epoch_done(self) -> bool:
        """True once the prompt data ran out."""
        return getattr(self.samples_generator, "_dataloader_iter", None) is None

    def _evaluate(self, step: int) -> None:
        """Evaluates under the vLLM lock and sends the metrics (with ``timing/eval``) to the trainer."""
        self._last_eval_step = step
        ray.get(self.vllm_lock.acquire.remote())
        try:
            start = time.time()
            try:
                logs = self._run_eval()
            except RewardError as err:
                raise RewardError(f"{err} (the evaluation at step {step})") from None
            logs[rd.EVAL_TIME] = time.time() - start
        finally:
            ray.get(self.vllm_lock.release.remote())
        self.rollout_queue.put((EVAL, step, logs), block=True)

    def _evaluation_on(self) -> bool:
        return self.eval_dataloader is not None and math.isfinite(float(self.args.eval.steps))

    def fit(self, episode: int, total_consumed_prompts: int, global_step: int = 0) -> None:
        """OpenRLHF's generator loop, with a fresh run's step-0 evaluation, DPPO's learning and state after
        each batch, and the last step's evaluation after "done"."""
        if global_step == 0 and self._evaluation_on():
            self.rollout_slots.get(block=True)  # the trainer returns the token when it reads the result
            self._evaluate(0)
        elif global_step > 0:  # a resume: the run evaluated its checkpointed step before it stopped
            self._last_eval_step = global_step
        just_evaluated, clock = False, BufferClock()
        for epoch in range(episode, self.args.train.num_episodes):
            while True:
                step = self.rollout_slots.get(block=True)  # the trainer's step when it took a batch
                if self._should_eval(step) and not just_evaluated:
                    just_evaluated = True  # the trainer answers with the same step: no second evaluation
                    self._evaluate(step)
                    continue
                just_evaluated = False
                rollouts, pass_rate, consumed, exhausted, seconds, unserved = self._generate(clock)
                total_consumed_prompts += consumed
                if rollouts:
                    rollouts.ctx.responses = []  # used by the generator only: not sent
                    if self.dppo.method == "dppo":
                        self._learn(rollouts)
                    # a batch that ran the prompt data out ends its epoch (as the sync trainer's checkpoint)
                    states = {
                        "episode": epoch + 1 if self._epoch_done() else epoch,
                        "total_consumed_prompts": total_consumed_prompts,
                        "data_loader_state_dict": self.prompts_dataloader.state_dict(),
                    }
                    if self.dppo.method == "dppo":
                        states[DPPO_STATE] = self.samples_generator.dppo_state_dict()
                    self.rollout_queue.put((rollouts, states, pass_rate, seconds, unserved), block=True)
                else:
                    self.rollout_slots.put(step, block=True)  # nothing sent: the token comes back here
                if exhausted:
                    break
        self.rollout_queue.put(DONE, block=True)
        step = self.final_step.get(block=True)  # the trainer's last step, sent when it read "done"
        if self._should_eval(step):
            self._evaluate(step)
        self.rollout_queue.put(CLOSED, block=True)


class _DPPOTrainingActor(DPPOSteps, _TrainingBase):
    """OpenRLHF's training actor with the sync trainer's step (``DPPOSteps``); its maker updates no
    history (the generator's)."""

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, vllm_lock, rollout_queue, rollout_slots,
                 final_step, dppo: DPPOConfig, run: RunMeta, max_steps: int):  # fmt: skip
        super().__init__(
            pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
            reference_model_group, vllm_engines, vllm_lock=vllm_lock, rollout_queue=rollout_queue,
            rollout_slots=rollout_slots,
        )  # fmt: skip
        self.final_step = final_step
        self._open_run(self.args, dppo, run, max_steps)
        self.experience_maker = self._make_experience_maker(None)
        self._checkpoint_states: dict | None = None

    def _observe_rates(self, stats: dict) -> None:
        """The generator's rate control has observed this batch already."""

    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's, calling ``BasePPOTrainer``'s by name (the host's zero-argument ``super()`` raises in
        this subclass's Ray worker)."""
        ray.get(self.vllm_lock.acquire.remote())
        if self._partial_rollout:
            batch_vllm_engine_call(self.vllm_engines, "pause_generation")
        try:
            BasePPOTrainer.broadcast_to_vllm(self)
        finally:
            if self._partial_rollout:
                batch_vllm_engine_call(self.vllm_engines, "resume_generation")
            ray.get(self.vllm_lock.release.remote())

    def dppo_state_dict(self) -> dict | None:
        raise RuntimeError("the DPPO state of an async run comes from the generator, in the client states")

    def init_checkpoint_states(self):
        if self._checkpoint_states is None:
            states = super().init_checkpoint_states()
            self._resume_run(states)
            self._checkpoint_states = states
        return self._checkpoint_states

    def fit(self, global_step: int = 0) -> None:
        self._recorded_fit(self._fit, global_step)

    def _fit(self, global_step: int) -> None:
        """OpenRLHF's training loop with the run directory and the closing handshake ("done" answered with
        the final step on ``final_step``)."""
        started, closing = time.time(), False
        latest: dict = {}  # the client states of the last step trained (a best checkpoint saves them)
        while True:
            payload = self.rollout_queue.get(block=True)
            if payload == CLOSED:
                break
            if payload == DONE:
                closing = True
                self.final_step.put(global_step, block=True)
                continue
            if payload[0] == EVAL:
                _, step, logs = payload
                if not closing:
                    self.rollout_slots.put(global_step, block=True)
                self._record_eval(step, logs)
                if self.wandb_logger:
                    self.wandb_logger.log_eval(step, logs)
                if self.tensorboard_logger:
                    self.tensorboard_logger.log_eval(step, logs)
                if step > 0:  # the starting point is no candidate (the sync trainer's evaluate(0) saves none)
                    self.save_best_checkpoint(logs, step, {**latest, "global_step": global_step})
                started = time.time()  # the next step's time excludes the evaluation
                continue
            rollouts, states, pass_rate, seconds, unserved = payload
            self.rollout_slots.put(global_step, block=True)  # the generator may start the next batch
            status, global_step = self.train_step(rollouts, global_step)
            for key, value in unserved.items():  # as generated and as untrained alike
                status[key] = status.get(key, 0.0) + value
            status[rd.GENERATION] = seconds
            # wall-clock of the whole step, queue wait included (its parts overlap with generation)
            status[rd.STEP_TOTAL] = time.time() - started
            started = time.time()
            if self.args.algo.dynamic_filtering_enable:
                status["dynamic_filtering_pass_rate"] = pass_rate
            states["global_step"] = global_step
            latest = dict(states)
            self.save_logs_and_checkpoints(global_step, status, states)
        if self.wandb_logger:
            self.wandb_logger.close()
        if self.tensorboard_logger:
            self.tensorboard_logger.close()


DPPOGenerateSamplesActor = remote_like(host.GenerateSamplesActor, _DPPOGenerateSamplesActor)
DPPOTrainingActor = remote_like(host.TrainingActor, _DPPOTrainingActor)


class _DPPOTrainerAsync(_ControllerBase):
    """OpenRLHF's async controller, building the two DPPO actors (with ``DPPOConfig``, ``RunMeta``, the
    schedule's step count and the handshake queue); ``fit`` restores the generator's state on a resume."""

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, dppo: DPPOConfig, run: RunMeta,
                 **generate_kwargs):  # fmt: skip
        args = strategy.args
        if args.eval.steps == -1:
            args.eval.steps = float("inf")  # no evaluation (OpenRLHF's convention)
        if args.ckpt.save_steps == -1:
            args.ckpt.save_steps = float("inf")  # no checkpoint
        size = getattr(args.train, "async_queue_size", 1)
        if size <= 0:
            raise ValueError(f"--train.async_queue_size must be positive, got {size}")
        self.rollout_queue = Queue(maxsize=size)
        self.rollout_slots = Queue(maxsize=size)
        for _ in range(size):
            self.rollout_slots.put(0, block=True)
        self.final_step = Queue(maxsize=1)
        lock = host.VLLMLock.remote()
        channels = dict(vllm_lock=lock, rollout_queue=self.rollout_queue, rollout_slots=self.rollout_slots,
                        final_step=self.final_step, dppo=dppo, run=run)  # fmt: skip
        self.generator_actor = DPPOGenerateSamplesActor.remote(
            pretrain=pretrain, strategy=strategy, vllm_engines=vllm_engines, **channels, **generate_kwargs
        )
        max_steps = ray.get(self.generator_actor.get_max_steps.remote())
        self.trainer_actor = DPPOTrainingActor.remote(
            pretrain=pretrain, strategy=strategy, actor_model_group=actor_model_group,
            critic_model_group=critic_model_group, reward_model_group=reward_model_group,
            reference_model_group=reference_model_group, vllm_engines=vllm_engines, max_steps=max_steps,
            **channels,
        )  # fmt: skip

    def fit(self) -> None:
        states = ray.get(self.trainer_actor.init_checkpoint_states.remote())
        ray.get(self.trainer_actor.restore_best_checkpoint_state.remote(states))
        step = int(states["global_step"])
        if step > 0:  # the generator's whole state, and vLLM's weights, as of the checkpointed step
            ray.get(
                [self.generator_actor.restore.remote(states), self.trainer_actor.broadcast_to_vllm.remote()]
            )
        ray.get([
            self.generator_actor.fit.remote(
                episode=states["episode"], total_consumed_prompts=states.get("total_consumed_prompts", 0),
                global_step=step,
            ),
            self.trainer_actor.fit.remote(global_step=step),
        ])  # fmt: skip


DPPOTrainerAsync = remote_like(host.PPOTrainerAsync, _DPPOTrainerAsync)
