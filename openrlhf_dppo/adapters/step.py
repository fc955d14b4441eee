"""What one training step carries from the trainer to the samples generator and the experience maker,
and back (plain dataclasses: no host imports).

The trainer makes one ``StepContext`` per step and hands it, explicitly, down the pipeline:

    DPPOTrainer._next_rollouts    makes StepContext(step) when OpenRLHF's loop asks for the rollouts
      -> samples_generator.generate_samples(ctx)      fills draw, filtered, generation / prompt counts
    DPPOTrainer.train_step        takes the step's context back: rollout statistics (raw rewards of
                                  every rolled-out group), then OpenRLHF's step with
      -> experience_maker.make_experience_batch(ctx, samples)   fills dispatch, pruning metrics/counts
      -> balance_experiences(ctx, ...)                          reads dispatch
      -> the actors' fit          their status carries the trained and filler counts
    DPPOTrainer.train_step        status = OpenRLHF's + ctx.metrics; generated = trained + pruned +
                                  filtered is checked

| field      | written by                        | read by                         |
|------------|-----------------------------------|---------------------------------|
| step       | trainer (1-based step number)     | maker (history stamp, seeds), reward errors |
| draw       | generator (its last prompt draw)  | maker (normaliser), trainer (HT reward) |
| filtered   | generator (groups dynamic filtering dropped) | maker (history), trainer (stats, counts) |
| dispatch   | maker (packed per-rank plan)      | trainer (``balance_experiences``) |
| metrics    | generator, maker, trainer (GRPO's trained count); ``add`` sums counts | trainer (the step's status) |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROMPT_ATTR = "dppo_prompt"  # attribute on each training rollout (Experience): its PromptDraw


@dataclass(frozen=True)
class PromptDraw:
    """Dataset index of a rolled-out prompt and the probability q it was kept with."""

    index: int
    q: float


@dataclass
class DrawRecord:
    """One prompt draw of the samples generator."""

    drawn: int = 0  # prompts taken from the dataloader (replacements of dynamic filtering included)
    kept: int = 0  # of the first draw, prompts kept by the pruning mask
    rolled_out: int = 0  # prompts sent to vLLM


@dataclass
class StepContext:
    """One training step's flow (see the module docstring)."""

    step: int
    draw: DrawRecord | None = None
    filtered: list = field(default_factory=list)  # Experience objects of the dropped groups, in groups of G
    dispatch: Any = None  # adapters.dispatch.DispatchPlan
    metrics: dict = field(default_factory=dict)

    def add(self, counts: dict) -> None:
        """Add counts to ``metrics`` (a step can make several draws: counts accumulate)."""
        for key, value in counts.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + float(value)
