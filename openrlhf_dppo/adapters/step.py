"""What one training step carries and the rules its parts share; every adapter imports this module and
no other adapter's helpers.

The step rides on what OpenRLHF 0.11.2 passes along unchanged (``PPOTrainer.fit`` /
``BasePPOTrainer.train_step``):
- the list ``generate_samples()`` returns goes as is to ``train_step(rollouts, step)`` and on to
  ``make_experience_batch``: it is a ``Rollouts``, the step's ``StepContext`` on ``.ctx``;
- the list ``make_experience_batch`` returns goes as is to ``balance_experiences``: a
  ``PlannedExperiences``, the packed per-rank plan on ``.plan`` (``adapters.dispatch``);
- ``generate_kwargs`` go as is from ``_generate_vllm`` to every ``_process_response_into_experience``:
  the generator passes the context as the ``dppo_step`` generate kwarg.

| StepContext | written by                                  | read by                                       |
|-------------|---------------------------------------------|-----------------------------------------------|
| step        | generator (1-based step number)             | maker (history stamp, seeds), reward errors   |
| draw        | generator (the step's prompt draw)          | maker (normaliser, steps), trainer (HT reward)|
| prompts     | generator (text -> dataset index, q)        | maker (weights 1/q, history), trainer         |
| responses   | generator's response hook (every rollout)   | generator (what dynamic filtering dropped)    |
| filtered    | generator (groups dynamic filtering dropped)| maker (history), trainer (statistics, counts) |
| metrics     | generator, maker; ``add`` sums counts       | trainer (the step's status)                   |

Also here: the run's shape from OpenRLHF's arguments (data-parallel size, whether A == 0 may be dropped,
optimizer steps of a batch and of the LR schedule), the step's checks (``check_accounting``,
``RewardError``), the rollout statistics and the prompt history's update from a step's rollouts, and how
a ``@ray.remote`` class of the host is subclassed (Ray 2.55 keeps the Python class at
``ActorClass.__ray_metadata__.modified_class.__ray_actor_class__`` and the options at
``ActorClass._default_options``).
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


# ---- what one step carries -----------------------------------------------------------------------
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
    """One training step's flow (the table above)."""

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
    """A step's rollouts (OpenRLHF's single-sample ``Experience`` objects, whole groups of G) with the
    step's context."""

    def __init__(self, samples=(), ctx: StepContext | None = None):
        super().__init__(samples)
        self.ctx = ctx


class PlannedExperiences(list):
    """The experiences ``make_experience_batch`` returns, with the packed per-rank dispatch plan
    (``adapters.dispatch.DispatchPlan``) that ``balance_experiences`` follows."""

    def __init__(self, experiences=(), plan: Any = None):
        super().__init__(experiences)
        self.plan = plan


# ---- the run's shape, from OpenRLHF's arguments ---------------------------------------------------
def effective_dp_size(args) -> int:
    """Data-parallel ranks: actor GPUs over ring-attention and tensor-parallel groups."""
    nodes, gpus = args.actor.num_nodes, args.actor.num_gpus_per_node
    return nodes * gpus // args.ds.ring_attn_size // args.ds.tensor_parallel_size


def has_aux_terms(args) -> bool:
    """True when a completion with A == 0 can still have a gradient (KL in reward or loss, entropy)."""
    entropy = args.actor.entropy_coef is not None and args.actor.entropy_coef != 0
    return args.algo.kl.init_coef > 0 or entropy


def zero_advantage_is_exact(args) -> bool:
    """True when a completion whose group advantage is 0 has no gradient, so p = 0 for it is exact: no KL or
    entropy term, and no batch whitening (REINFORCE++-baseline subtracts the batch's token mean, which
    gives such a completion the advantage -m / s)."""
    return not has_aux_terms(args) and args.algo.advantage.estimator not in BATCH_WHITENED


def response_tokens(sample) -> int:
    """Action tokens of one rollout."""
    return int(sample.action_mask.sum().item())


def num_optimizer_steps(
    rollout_batch_size: int, n_samples: int, train_batch_size: int, groups: int | None = None,
    train_short: bool = False, dp_size: int = 1,
) -> int:  # fmt: skip
    """The optimizer steps GRPO takes for a rollout batch of ``groups`` prompts' rollouts (default and at
    most B) in OpenRLHF's dynamic-batch mode: its whole train batches, ``min(B, groups) * G //
    train_batch_size``; 0 for a batch smaller than one train batch (an epoch's short last batch), unless
    ``train_short`` (``--dppo.short_batch train``), which makes it 1 when it holds at least ``dp_size``
    rollouts: fewer cannot be spread over the data-parallel ranks (the GRPO arm leaves them untrained)."""
    rollouts = (rollout_batch_size if groups is None else min(rollout_batch_size, groups)) * n_samples
    steps = rollouts // train_batch_size
    return 1 if train_short and steps == 0 and rollouts >= dp_size else steps


def short_batch_steps(args, prompts: int, rule: str) -> int:
    """The optimizer steps a run makes beyond OpenRLHF's count (``prompts x G // train batch`` per episode
    and PPO epoch): under ``--dppo.short_batch train`` a rollout batch smaller than one train batch makes a
    step of its own (``num_optimizer_steps``); 0 under ``drop``."""
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
    """The optimizer steps the LR schedule spans (OpenRLHF's ``get_max_steps``): ``host_steps``, or the
    steps of ``step_limit`` training steps if fewer (``--dppo.max_steps``), or those of ``span`` training
    steps whether or not the run makes them (``--dppo.schedule_steps``). A span shorter than the run is
    refused (``DPPOConfigError``): past its end the cosine would climb back up. per_step: the optimizer
    steps of a training step (default GRPO's, B G // train batch)."""
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
    """The optimizer steps the LR schedule spans for this run: OpenRLHF's count (``host_steps``) plus the
    short batches' steps, cut to ``--dppo.max_steps``, spread to ``--dppo.schedule_steps``. prompts: the
    prompt dataset's length. CPPO (``--dppo.method cppo``) counts its own steps (``cppo_steps``)."""
    if dppo.method == "cppo":
        host_steps, per_step = cppo_steps(args, prompts, dppo)
        return scheduler_steps(args, host_steps, run.max_steps, run.schedule_steps, per_step)
    host_steps += short_batch_steps(args, prompts, dppo.short_batch)
    return scheduler_steps(args, host_steps, run.max_steps, run.schedule_steps)


def cppo_steps(args, prompts: int, dppo: DPPOConfig) -> tuple[int, int]:
    """CPPO's optimizer steps over the run and those of one full training step: an epoch of ``prompts``
    draws int(B / (1 - P)) prompts a step (``core.cppo.cppo_prompts``), and a step makes the whole train
    batches of its G - int(G P) kept completions a group (``num_optimizer_steps``; an epoch's short last
    draw by ``--dppo.short_batch``), per episode and PPO epoch."""
    P, G, T = dppo.completion_prune_rate, args.rollout.n_samples_per_prompt, args.train.batch_size
    drawn, kept = cppo_prompts(args.rollout.batch_size, P), cppo_kept_per_group(G, P)
    train, dp = dppo.short_batch == "train", effective_dp_size(args)
    full, rest = divmod(prompts, drawn)
    per_step = num_optimizer_steps(drawn, kept, T, drawn, train, dp)
    made = full * per_step + (num_optimizer_steps(drawn, kept, T, rest, train, dp) if rest else 0)
    return made * args.train.num_episodes * args.train.max_epochs, per_step


# ---- the step's checks ------------------------------------------------------------------------------
class RewardError(RuntimeError):
    """The reward function gave no finite reward for a rollout."""


class AccountingError(RuntimeError):
    """Generated tokens/samples do not equal trained + pruned + filtered + untrained."""


def check_accounting(status: dict) -> None:
    """Each unit's generated count must equal trained + pruned + filtered + untrained, five counts each
    taken where it happens: generated and filtered by the samples generator, pruned by the experience
    maker's mask, trained and untrained by the actors from their micro-batches and replay buffers."""
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


# ---- rollout statistics and the prompt history's update ------------------------------------------
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
    """Every rolled-out group's shaped rewards into the prompt history, stamped with ``ctx.step``, those
    dynamic filtering dropped (``ctx.filtered``) included: the history must learn that an always-solved
    prompt is uninformative, whether or not it was kept. shaped: the (n, G) shaped rewards of ``samples``
    where the caller has them (the sync maker shapes the step's rollouts in place anyway); otherwise (the
    async generator, whose rollouts go on with their raw rewards) they are shaped on copies, as
    ``ctx.filtered``'s always are."""
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


# ---- Ray actor classes and host module globals ----------------------------------------------------
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
    """Set ``obj.name = value`` for the duration of the block, then restore the previous value (an
    instance attribute that only shadowed its class's attribute, e.g. a method, is removed again)."""
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
