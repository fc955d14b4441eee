"""What one training step carries, as typed fields on the lists OpenRLHF passes along unchanged
(plain dataclasses: no host imports).

What OpenRLHF 0.11.2 passes through unchanged (``PPOTrainer.fit`` / ``BasePPOTrainer.train_step``):
- the list ``samples_generator.generate_samples(**generate_kwargs)`` returns goes, as is, to
  ``train_step(rollout_samples, step)`` and from there to ``experience_maker.make_experience_batch``;
- the list ``make_experience_batch`` returns goes, as is, to ``balance_experiences(experiences, args)``;
- ``generate_kwargs`` go, as is, from ``SamplesGenerator._generate_vllm`` to every
  ``_process_response_into_experience(response, **generate_kwargs)`` of the call.
So the step's ``StepContext`` rides on ``Rollouts.ctx``, the packed plan on ``PlannedExperiences.plan``,
and the generator hands the context to its response hook as the ``dppo_step`` generate kwarg:

    samples_generator.generate_samples()       makes StepContext(step); ONE never-empty prompt draw
      -> Rollouts(samples, ctx)                 fills draw, prompts, filtered, generation counts
    trainer.train_step(rollouts)                rollout statistics from rollouts.ctx (raw rewards)
      -> experience_maker.make_experience_batch(rollouts)      reads/fills rollouts.ctx
      -> PlannedExperiences(experiences, plan)
      -> balance_experiences(experiences)       returns experiences.plan's per-rank batches
      -> the actors' fit                        their status carries the trained and filler counts
    trainer.train_step                          status = OpenRLHF's + ctx.metrics; accounting check

| field      | written by                                  | read by                                  |
|------------|---------------------------------------------|------------------------------------------|
| step       | generator (1-based step number)             | maker (history stamp, seeds), reward errors |
| draw       | generator (the step's prompt draw)          | maker (normaliser), trainer (HT reward)  |
| prompts    | generator (text -> dataset index, q)        | maker (weights 1/q, history), trainer (HT reward) |
| responses  | generator's response hook (every rollout)   | generator (what dynamic filtering dropped) |
| filtered   | generator (groups dynamic filtering dropped) | maker (history), trainer (stats, counts) |
| metrics    | generator, maker; ``add`` sums counts       | trainer (the step's status)              |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptDraw:
    """Dataset index of a rolled-out prompt and the probability q it was rolled out with (1 when not
    pruned: GRPO, dynamic filtering's replacements)."""

    index: int
    q: float


@dataclass
class DrawRecord:
    """The step's prompt draw."""

    drawn: int = 0  # prompts taken from the dataloader (replacements of dynamic filtering included)
    kept: int = 0  # of the draw, prompts kept by the pruning mask
    rolled_out: int = 0  # prompts sent to vLLM


@dataclass
class StepContext:
    """One training step's flow (see the module docstring)."""

    step: int
    draw: DrawRecord | None = None
    prompts: dict[str, PromptDraw] = field(default_factory=dict)  # prompt text -> its draw
    responses: list = field(default_factory=list)  # every training Experience vLLM returned
    filtered: list = field(default_factory=list)  # Experience objects of the dropped groups, in groups of G
    metrics: dict = field(default_factory=dict)

    def prompt(self, text: str) -> PromptDraw | None:
        return self.prompts.get(text)

    def add(self, counts: dict) -> None:
        """Add counts to ``metrics``."""
        for key, value in counts.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + float(value)


class Rollouts(list):
    """A step's rollouts (OpenRLHF's list of single-sample ``Experience``, whole groups of G) with the
    step's context: what ``generate_samples`` returns and OpenRLHF hands on to ``train_step`` and
    ``make_experience_batch`` unchanged."""

    def __init__(self, samples=(), ctx: StepContext | None = None):
        super().__init__(samples)
        self.ctx = ctx


class PlannedExperiences(list):
    """The experiences ``make_experience_batch`` returns, with the packed per-rank dispatch plan
    (``adapters.dispatch.DispatchPlan``) that ``balance_experiences`` follows."""

    def __init__(self, experiences=(), plan: Any = None):
        super().__init__(experiences)
        self.plan = plan
