"""Actor side (the DeepSpeed ranks, Ray workers), both arms: the replay buffer follows the controller's
plan (``adapters.dispatch``; GRPO items take the parent's path) and counts what no micro-batch trains;
the actor trainer marks each optimizer step's last micro-batch as DeepSpeed's accumulation boundary,
weights the KL-in-loss and entropy terms per sequence and adds the ``samples|tokens/trained|fillers|untrained``
counts, summed over ranks, to the status.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from openrlhf.trainer.ray import ppo_actor
from openrlhf.utils.logging_utils import init_logger
from openrlhf.utils.loss_utils import _get_dp_group

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters.dispatch import pop_short_batch_rule, read_plan
from openrlhf_dppo.adapters.step import remote_like, swap_attr, unwrap_actor_class

logger = init_logger(__name__)


class DPPOReplayBuffer(NaiveReplayBuffer):
    """NaiveReplayBuffer whose dynamic batches follow the DPPO dispatch plan."""

    dynamic_indices: list[list[int]]  # set by the parent's constructor: micro-batch -> item indices

    @classmethod
    def like(cls, buffer: NaiveReplayBuffer) -> DPPOReplayBuffer:
        """A DPPO buffer with the settings of an existing (empty) OpenRLHF buffer."""
        return cls(
            buffer.sample_batch_size,
            buffer.limit,
            buffer.cpu_offload,
            buffer.packing_samples,
            buffer.dynamic_batch,
        )

    def setup_dynamic_batch(self, strategy):
        plan = read_plan(self.items)
        if plan is None:  # GRPO
            train_short = pop_short_batch_rule(self.items)
            super().setup_dynamic_batch(strategy)
            if train_short and not self.dynamic_indices:
                self._add_short_step(strategy)
            return
        self._check_equal_counts(strategy, len(plan.indices))
        self.dynamic_indices = plan.indices
        self.dynamic_optimizer_step = plan.step_end
        self.dynamic_batch_num_tokens = plan.num_tokens
        self.dynamic_global_batch_size = plan.num_seqs
        self.dynamic_sample_loss_scale = plan.loss_scale
        self.sample_batch_size = 1

    def untrained_counts(self) -> list[int]:
        """[sequences, action tokens] this rank holds that no micro-batch trains, zero-weight fillers not
        counted; [0, 0] without dynamic batching (a partial micro-batch is refused there)."""
        if not self.dynamic_batch:
            return [0, 0]
        trained = {i for mb in self.dynamic_indices for i in mb}
        rest = [it for i, it in enumerate(self.items) if i not in trained]
        rest = [
            it
            for it in rest
            if it.info.get(rd.SAMPLE_WEIGHT) is None or float(it.info[rd.SAMPLE_WEIGHT]) != 0
        ]
        return [len(rest), sum(int(it.action_mask.sum()) for it in rest)]

    def _add_short_step(self, strategy) -> None:
        """``--dppo.short_batch train``, GRPO: a batch smaller than one train batch becomes one optimizer
        step, split and normalised as the host does a step. Left untrained, with a warning, when some rank
        holds fewer rollouts than the micro-batches every rank must run (a collective backward)."""
        from openrlhf.utils.seqlen_balancing import (
            get_minimum_num_micro_batch_size,
            get_seqlen_balanced_partitions,
        )

        args = strategy.args
        lengths = [int(it.total_length.item()) for it in self.items]
        budget = (args.train.max_tokens_per_gpu, args.ds.ring_attn_size, args.ds.tensor_parallel_size)
        needed = get_minimum_num_micro_batch_size(lengths, *budget) if lengths else 0
        most, fewest, count = _reduce_ints(strategy, [len(lengths), -len(lengths), needed], dist.ReduceOp.MAX)
        if most == 0:
            return
        if -fewest < count:
            logger.warning(
                f"--dppo.short_batch train: the short batch ({-fewest} to {most} rollouts per data-parallel "
                f"rank) cannot fill the {count} micro-batches every rank must run; it is not trained "
                "(counted as samples|tokens/untrained)"
            )
            return
        partitions = get_seqlen_balanced_partitions(lengths, count, False)
        actions = [int(it.action_mask.sum()) for it in self.items]
        live, tokens = _reduce_ints(strategy, [sum(a > 0 for a in actions), sum(actions)], dist.ReduceOp.SUM)
        self.dynamic_indices = [list(p) for p in partitions]
        self.dynamic_sample_loss_scale = [len(p) / len(lengths) for p in partitions]
        self.dynamic_batch_num_tokens = [float(tokens)] * count
        self.dynamic_global_batch_size = [float(live)] * count
        self.dynamic_optimizer_step = [0] * (count - 1) + [1]
        self.sample_batch_size = 1

    @staticmethod
    def _check_equal_counts(strategy, count: int) -> None:
        """Raises unless every rank runs ``count`` micro-batches (a collective backward)."""
        most, fewest = _reduce_ints(strategy, [count, -count], dist.ReduceOp.MAX)
        if most != count or -fewest != count:
            raise RuntimeError(
                f"DPPO dispatch: this rank has {count} micro-batches, others between {-fewest} and "
                f"{most}; every rank must run the same number"
            )


def _all_reduce(strategy, t: torch.Tensor, op) -> torch.Tensor:
    """``t`` (a CPU tensor) reduced over the data-parallel ranks, returned on the CPU (unchanged without a
    process group); the collective runs on the current CUDA device where there is one, else the CPU."""
    if not (dist.is_available() and dist.is_initialized()):
        return t
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    t = t.to(device)
    dist.all_reduce(t, op=op, group=_get_dp_group(strategy))
    return t.cpu()


def _reduce_ints(strategy, values: list[int], op) -> list[int]:
    return [int(v) for v in _all_reduce(strategy, torch.tensor(values, dtype=torch.int64), op)]


def micro_batch_counts(experience) -> torch.Tensor:
    """(4,) float64 on the device of ``experience.action_mask`` (CUDA on a GPU rank), every tensor of the
    count on that one device: sequences and action tokens with a non-zero weight (trained), then with
    weight 0 (fillers). Without weights (GRPO) everything is trained."""
    mask = experience.action_mask
    tokens = mask.reshape(mask.shape[0], -1).sum(-1).to(torch.float64)
    weights = _sequence_weights(experience)
    live = torch.ones_like(tokens, dtype=torch.bool) if weights is None else weights.to(tokens.device) != 0
    dead = ~live
    return torch.stack([live.sum().to(tokens), tokens[live].sum(), dead.sum().to(tokens), tokens[dead].sum()])


COUNT_KEYS = (rd.SAMPLES_TRAINED, rd.TOKENS_TRAINED, rd.SAMPLES_FILLERS, rd.TOKENS_FILLERS)
UNTRAINED_KEYS = (rd.SAMPLES_UNTRAINED, rd.TOKENS_UNTRAINED)


def step_counts(counts: torch.Tensor | None, untrained: list[int], epochs: int, strategy) -> dict:
    """``COUNT_KEYS`` from this rank's summed ``micro_batch_counts`` (None: none ran) per PPO epoch, and
    ``UNTRAINED_KEYS`` from ``untrained_counts``, summed over the data-parallel ranks (on the CPU)."""
    if counts is None:
        counts = torch.zeros(4, dtype=torch.float64)
    rank = torch.cat(
        [counts.detach().cpu().to(torch.float64) / epochs, torch.tensor(untrained, dtype=torch.float64)]
    )
    total = _all_reduce(strategy, rank, dist.ReduceOp.SUM).tolist()
    return dict(zip(COUNT_KEYS + UNTRAINED_KEYS, total))


def _sequence_weights(experience) -> torch.Tensor | None:
    w = experience.info.get(rd.SAMPLE_WEIGHT)
    if w is None:
        return None
    if isinstance(w, list):
        w = torch.stack([torch.as_tensor(x).reshape(()) for x in w])
    return torch.as_tensor(w).reshape(-1)


@contextlib.contextmanager
def weighted_aux_losses(weights: torch.Tensor):
    """Within the block, ``ppo_actor.aggregate_loss`` weights row i of the per-token term by weights[i]."""
    original = ppo_actor.aggregate_loss

    def weighted(loss, loss_mask, *args, **kwargs):
        w = weights.to(device=loss.device, dtype=loss.dtype).reshape((-1,) + (1,) * (loss.dim() - 1))
        return original(loss * w, loss_mask, *args, **kwargs)

    with swap_attr(ppo_actor, "aggregate_loss", weighted):
        yield


def set_accumulation_boundary(actor, last: bool) -> None:
    """Tell the DeepSpeed engine behind ``actor`` (an OpenRLHF ``Actor``, its engine in ``.model``) whether
    the coming backward is the last of its optimizer step. OpenRLHF's dynamic batches run DeepSpeed with
    ``gradient_accumulation_steps`` 1, where every backward counts as a boundary: under ZeRO stages 1 and
    2 each backward then replaces the gradient the previous ones left, and ``step()`` applies the last
    micro-batch's alone. Marked, the micro-batches of a step add up (the gradient of their summed loss).
    A model without the setter (no DeepSpeed engine) is left as it is."""
    engine = getattr(actor, "model", actor)
    setter = getattr(engine, "set_gradient_accumulation_boundary", None)
    if setter is not None:
        setter(last)


class DPPOActorTrainer(ppo_actor.ActorPPOTrainer):
    """ActorPPOTrainer with the DPPO replay buffer and weighted KL-in-loss / entropy terms."""

    # micro_batch_counts summed since ppo_train began, on the micro-batches' device (None before the first)
    _counts: torch.Tensor | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay_buffer: DPPOReplayBuffer = DPPOReplayBuffer.like(self.replay_buffer)

    def ppo_train(self, kl_ctl: float):
        if not self.args.train.dynamic_batch_enable:
            self._check_whole_micro_batches()
        self._counts = None
        status = super().ppo_train(kl_ctl)
        untrained = self.replay_buffer.untrained_counts()
        status.update(step_counts(self._counts, untrained, self.max_epochs, self.strategy))
        return status

    def _check_whole_micro_batches(self) -> None:
        """Without dynamic batching (GRPO only) the host's loader would drop a partial last micro-batch:
        refused before any training."""
        held, size = len(self.replay_buffer.items), self.replay_buffer.sample_batch_size
        if held % size:
            raise RuntimeError(
                f"this rank holds {held} rollouts, not a multiple of --train.micro_batch_size {size}: "
                f"OpenRLHF's unpacked path would leave the last {held % size} untrained. Turn on "
                "--train.dynamic_batch_enable (packed micro-batches train them all), or make the rollouts "
                "per rank (--rollout.batch_size x --rollout.n_samples_per_prompt / data-parallel size, and "
                "so the prompt count in each epoch's last batch) a multiple of --train.micro_batch_size"
            )

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        counts = micro_batch_counts(experience)
        self._counts = counts if self._counts is None else self._counts + counts
        if self.args.train.dynamic_batch_enable:
            set_accumulation_boundary(self.actor, bool(self.replay_buffer.dynamic_optimizer_step[step]))
        weights = _sequence_weights(experience)
        if weights is None:
            return super().training_step(experience, kl_ctl, step, loss_batch_info)
        with weighted_aux_losses(weights):
            return super().training_step(experience, kl_ctl, step, loss_batch_info)


# The class behind the host's Ray actor, typed Any to be a base for mypy.
_PolicyModelActorBase: Any = unwrap_actor_class(ppo_actor.PolicyModelActor)


class _DPPOPolicyModelActor(_PolicyModelActorBase):
    def init_model_from_pretrained(self, *args, **kwargs):
        with swap_attr(ppo_actor, "ActorPPOTrainer", DPPOActorTrainer):
            return super().init_model_from_pretrained(*args, **kwargs)


DPPOPolicyModelActor = remote_like(ppo_actor.PolicyModelActor, _DPPOPolicyModelActor)
