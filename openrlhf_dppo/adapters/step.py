"""What one training step carries and the rules its parts share; every adapter imports this module and
no other adapter's helpers. The step rides on what OpenRLHF 0.11.2 passes along unchanged: ``Rollouts``
(with the ``StepContext`` on ``.ctx``) from ``generate_samples()`` to ``make_experience_batch``,
``PlannedExperiences`` (the plan on ``.plan``) to ``balance_experiences``, and the ``dppo_step``
generate kwarg to every ``_process_response_into_experience``.

| StepContext | written by                                  | read by                                       |
|-------------|---------------------------------------------|-----------------------------------------------|
| step        | generator (1-based step number)             | maker (history stamp, seeds), reward errors   |
| draw        | generator (the step's prompt draw)          | maker (normaliser, steps), trainer (HT reward)|
| prompts     | generator (text -> dataset index, q)        | maker (weights 1/q, history), trainer         |
| responses   | generator's response hook (every rollout)   | generator (what dynamic filtering dropped)    |
| filtered    | generator (groups dynamic filtering dropped)| maker (history), trainer (statistics, counts) |
| metrics     | generator, maker; ``add`` sums counts       | trainer (the step's status)                   |
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.core import BATCH_WHITENED, DPPOConfig, reward_stats
from openrlhf_dppo.core.config import DPPOConfigError
from openrlhf_dppo.core.cppo import cppo_kept_per_group, cppo_prompts
from openrlhf_dppo.run_dir import RunMeta

DPPO_STATE = "dppo_state"  # the checkpoint's client-state key of DPPO's draw state


@dataclass(frozen=True)
class PromptDraw:
    """Dataset index of a rolled-out prompt and its keep probability q (1 when not pruned)."""

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
    """One training step's flow (the table above)."""

    step: int
    draw: DrawRecord | None = None
    prompts: dict[str, PromptDraw] = field(default_factory=dict)  # prompt text -> its draw
    responses: list = field(default_factory=list)  # every training Experience vLLM returned
    filtered: list = field(default_factory=list)  # Experience objects of the dropped groups, in groups of G
    metrics: dict = field(default_factory=dict)

    def add(self, counts: dict) -> None:
        """Add counts to ``metrics``."""
        for key, value in counts.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + float(value)


class Rollouts(list):
    """A step's rollouts (single-sample ``Experience`` objects, whole groups) with its context."""

    def __init__(self, samples=(), ctx: StepContext | None = None):
        super().__init__(samples)
        self.ctx = ctx


class PlannedExperiences(list):
    """The experiences ``make_experience_batch`` returns, with the ``dispatch.DispatchPlan``."""

    def __init__(self, experiences=(), plan: Any = None):
        super().__init__(experiences)
        self.plan = plan


def effective_dp_size(args) -> int:
    """Data-parallel ranks: actor GPUs over ring-attention and tensor-parallel groups."""
    nodes, gpus = args.actor.num_nodes, args.actor.num_gpus_per_node
    return nodes * gpus // args.ds.ring_attn_size // args.ds.tensor_parallel_size


def zero_advantage_is_exact(args) -> bool:
    """True when a completion whose group advantage is 0 has no gradient, so p = 0 for it is exact: no KL
    (in reward or loss) or entropy term, and no batch whitening (which gives it the advantage -m / s)."""
    entropy = args.actor.entropy_coef is not None and args.actor.entropy_coef != 0
    aux = args.algo.kl.init_coef > 0 or entropy
    return not aux and args.algo.advantage.estimator not in BATCH_WHITENED


def response_tokens(sample) -> int:
    """Action tokens of one rollout."""
    return int(sample.action_mask.sum().item())


def num_optimizer_steps(
    rollout_batch_size: int, n_samples: int, train_batch_size: int, groups: int | None = None,
    train_short: bool = False, dp_size: int = 1,
) -> int:  # fmt: skip
    """GRPO's optimizer steps for a batch of ``groups`` prompts' rollouts (default and at most B):
    ``min(B, groups) * G // train_batch_size``; where that is 0, 1 under ``train_short`` when the batch
    holds at least ``dp_size`` rollouts."""
    rollouts = (rollout_batch_size if groups is None else min(rollout_batch_size, groups)) * n_samples
    steps = rollouts // train_batch_size
    return 1 if train_short and steps == 0 and rollouts >= dp_size else steps


def short_batch_steps(args, prompts: int, rule: str) -> int:
    """The optimizer steps a run makes beyond OpenRLHF's count under ``--dppo.short_batch train`` (the
    short batches'); 0 under ``drop``."""
    B, G, T = args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.batch_size
    full, rest = divmod(prompts, B)
    train, dp = rule == "train", effective_dp_size(args)
    made = full * num_optimizer_steps(B, G, T, B, train, dp)
    if rest:
        made += num_optimizer_steps(B, G, T, rest, train, dp)
    return max(0, made - prompts * G // T) * args.train.num_episodes * args.train.max_epochs


def scheduler_steps(
    args, host_steps: int, step_limit: int | None, span: int | None = None, per_step: int | None = None
) -> int:
    """The optimizer steps the LR schedule spans: ``host_steps``, or those of ``step_limit`` training steps
    if fewer, or those of ``span`` training steps (``--dppo.schedule_steps``; ``DPPOConfigError`` when
    shorter than the run). per_step: optimizer steps per training step (default GRPO's, B G // T)."""
    if per_step is None:
        per_step = args.rollout.batch_size * args.rollout.n_samples_per_prompt // args.train.batch_size
    per_step = max(1, per_step)
    epochs = args.train.max_epochs
    run_steps = host_steps if step_limit is None else min(host_steps, step_limit * per_step * epochs)
    if span is None:
        return run_steps
    spanned = span * per_step * epochs
    if spanned < run_steps:
        raise DPPOConfigError(
            "schedule_steps",
            span,
            f"must cover the run: {spanned} optimizer steps, fewer than the run's {run_steps} "
            "(from --train.num_episodes and --dppo.max_steps); past its end the cosine would climb back up",
        )
    return spanned


def planned_steps(args, host_steps: int, prompts: int, dppo: DPPOConfig, run: RunMeta) -> int:
    """The optimizer steps the LR schedule spans for this run (``scheduler_steps`` of OpenRLHF's count plus
    the short batches', or of CPPO's ``cppo_steps``). prompts: the prompt dataset's length."""
    if dppo.method == "cppo":
        host_steps, per_step = cppo_steps(args, prompts, dppo)
        return scheduler_steps(args, host_steps, run.max_steps, run.schedule_steps, per_step)
    host_steps += short_batch_steps(args, prompts, dppo.short_batch)
    return scheduler_steps(args, host_steps, run.max_steps, run.schedule_steps)


def cppo_steps(args, prompts: int, dppo: DPPOConfig) -> tuple[int, int]:
    """(CPPO's optimizer steps over the run, those of one full training step): int(B / (1 - P)) prompts
    a step, the whole train batches of the G - int(G P) kept of each group (``num_optimizer_steps``)."""
    P, G, T = dppo.completion_prune_rate, args.rollout.n_samples_per_prompt, args.train.batch_size
    drawn, kept = cppo_prompts(args.rollout.batch_size, P), cppo_kept_per_group(G, P)
    train, dp = dppo.short_batch == "train", effective_dp_size(args)
    full, rest = divmod(prompts, drawn)
    per_step = num_optimizer_steps(drawn, kept, T, drawn, train, dp)
    made = full * per_step + (num_optimizer_steps(drawn, kept, T, rest, train, dp) if rest else 0)
    return made * args.train.num_episodes * args.train.max_epochs, per_step


class RewardError(RuntimeError):
    """The reward function gave no finite reward for a rollout."""


class AccountingError(RuntimeError):
    """Generated tokens/samples do not equal trained + pruned + filtered + untrained."""


def check_accounting(status: dict) -> None:
    """Raises ``AccountingError`` unless each unit's generated = trained + pruned + filtered + untrained."""
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


def rollout_stats(samples, group_size: int, ctx: StepContext) -> dict | None:
    """``rollout/*`` of a step's rolled-out groups from their RAW rewards (q from ``ctx.prompts``, 1 when
    absent); None when a reward model scores them later."""
    if not samples or any(s.rewards is None for s in samples):
        return None
    rewards = torch.cat([s.rewards.reshape(-1) for s in samples]).to(torch.float64).reshape(-1, group_size)
    tags = [ctx.prompts.get(s.prompts[0]) for s in samples[::group_size]]
    q = torch.tensor([1.0 if t is None else t.q for t in tags], dtype=torch.float64)
    stats = reward_stats(rewards, q, ctx.draw.drawn if ctx.draw is not None else None)
    stats[rd.RESPONSE_LENGTH_MEAN] = torch.cat([s.response_length for s in samples]).float().mean().item()
    stats[rd.TRUNCATED_RATE] = torch.cat([s.truncated for s in samples]).float().mean().item()
    stats[rd.NUM_SAMPLES] = float(len(samples))
    return stats


def group_draws(ctx: StepContext, samples, G: int) -> list[PromptDraw]:
    """The draw of each group's prompt (``ctx.prompts``); every group must be one prompt's G rollouts."""
    if len(samples) % G:
        raise RuntimeError(f"{len(samples)} rollouts are not whole groups of {G}")
    texts = [s.prompts[0] for s in samples]
    groups = [texts[j : j + G] for j in range(0, len(texts), G)]
    for j, group in enumerate(groups):
        if group[0] not in ctx.prompts or any(t != group[0] for t in group):
            raise RuntimeError(f"rollouts {j * G}..{j * G + G - 1} are not one drawn prompt's group: {group}")
    return [ctx.prompts[g[0]] for g in groups]


def shaped_rewards(samples, args) -> torch.Tensor:
    """(n, G) rewards after OpenRLHF's length penalties (DAPO overlong, ProRL stop-properly), applied to
    ``samples`` in place (their ``rewards`` and ``info["reward"]``)."""
    for s in samples:
        s.rewards = s.rewards.to(torch.promote_types(s.rewards.dtype, torch.float32))
    apply_length_penalties(samples, args)
    return torch.cat([s.rewards for s in samples]).reshape(-1, args.rollout.n_samples_per_prompt)


def update_history(history, ctx: StepContext, samples, args, shaped: torch.Tensor | None = None) -> None:
    """Every rolled-out group's shaped rewards into the prompt history, ``ctx.filtered`` included, stamped
    with ``ctx.step``. shaped: the (n, G) shaped rewards of ``samples`` if the caller has them; otherwise
    they are shaped on copies, as ``ctx.filtered``'s always are."""
    rolled_out = list(samples) + list(ctx.filtered)
    index = [d.index for d in group_draws(ctx, rolled_out, args.rollout.n_samples_per_prompt)]
    copies = []
    for s in rolled_out if shaped is None else ctx.filtered:
        c = copy.copy(s)
        c.rewards, c.info = s.rewards.clone(), dict(s.info)
        copies.append(c)
    parts = ([] if shaped is None else [shaped]) + ([shaped_rewards(copies, args)] if copies else [])
    rewards = torch.cat([p.to(parts[0].dtype) for p in parts])
    history.update(torch.tensor(index, dtype=torch.int64), rewards, ctx.step)


def unwrap_actor_class(actor_class) -> type:
    """The Python class behind a ``@ray.remote`` class (or the class itself if it is not one)."""
    meta = getattr(actor_class, "__ray_metadata__", None)
    if meta is None:
        return actor_class
    modified = meta.modified_class
    return getattr(modified, "__ray_actor_class__", modified)


def remote_like(actor_class, subclass: type):
    """``ray.remote`` applied to ``subclass`` with the options ``actor_class`` was declared with."""
    options = dict(getattr(actor_class, "_default_options", None) or {})
    return ray.remote(**options)(subclass) if options else ray.remote(subclass)


@contextlib.contextmanager
def swap_attr(obj, name: str, value):
    """``obj.name = value`` for the block, then restored (an attribute not in ``obj.__dict__`` removed)."""
    previous = getattr(obj, name)
    owned = name in getattr(obj, "__dict__", {})
    setattr(obj, name, value)
    try:
        yield previous
    finally:
        if owned:
            setattr(obj, name, previous)
        else:
            delattr(obj, name)
