"""Actor side (the DeepSpeed ranks, Ray workers): replay buffer, actor trainer, policy actor.

The same classes run both arms (``adapters.install``); with ``--dppo.enable false`` they count and run
OpenRLHF's steps, with one addition. Seams (each overrides one method and calls the parent):
- ``DPPOReplayBuffer.setup_dynamic_batch``: follows the controller's dispatch plan (``adapters.dispatch``:
  packed micro-batches, equal count on every rank, FULL-batch loss normalisers) instead of re-partitioning
  the kept items and normalising by their count. Items without a plan (GRPO) take the parent's path, and
  what it leaves untrained -- it makes whole train batches only, so an epoch's short last rollout batch
  was generated and never trained -- becomes one more optimizer step (``_add_short_step``), as DPPO's
  plan trains a short draw.
- ``DPPOActorTrainer.training_step``: the KL-in-loss and entropy terms do not contain the advantage, so
  the weights folded into A do not reach them (METHOD.md condition 4). OpenRLHF reduces both with the
  module-global ``aggregate_loss`` of ``openrlhf.trainer.ray.ppo_actor`` (``PolicyLoss`` uses its own
  module's copy, untouched); for the duration of one ``training_step`` that global is replaced by one
  that multiplies each sequence's per-token term by its weight w_j * v_ji. It also counts what the
  micro-batch trains (``micro_batch_counts``: sequences and action tokens with a non-zero weight) and the
  zero-weight fillers it only forwards.
- ``DPPOActorTrainer.ppo_train``: adds those counts, summed over the data-parallel ranks and per PPO
  epoch, to the status as ``samples|tokens/trained`` and ``samples|tokens/fillers`` (the trainer checks
  generated = trained + pruned + filtered with them). Without dynamic batching (GRPO only) a rank's
  rollouts that are not whole micro-batches are refused by name first: the host's loader would drop them.
- ``DPPOPolicyModelActor.init_model_from_pretrained``: ``PolicyModelActor`` constructs
  ``ActorPPOTrainer`` by its module-global name; the subclass points that name at ``DPPOActorTrainer``
  for the duration of the parent call (which also builds the replay buffer, replaced right after).
Ray actor classes cannot be subclassed; ``adapters._ray`` unwraps the Python class and wraps the
subclass again with the parent's options.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from openrlhf.trainer.ray import ppo_actor
from openrlhf.utils.loss_utils import _get_dp_group

from openrlhf_dppo import run_dir as rd
from openrlhf_dppo.adapters._ray import remote_like, swap_attr, unwrap_actor_class
from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT, read_plan


class DPPOReplayBuffer(NaiveReplayBuffer):
    """NaiveReplayBuffer whose dynamic batches follow the DPPO dispatch plan."""

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
        if plan is None:  # GRPO: the host's whole train batches, then what they leave as one more step
            super().setup_dynamic_batch(strategy)
            self._add_short_step(strategy)
            return
        self._check_equal_counts(strategy, len(plan.indices))
        self.dynamic_indices = plan.indices
        self.dynamic_optimizer_step = plan.step_end
        self.dynamic_batch_num_tokens = plan.num_tokens
        self.dynamic_global_batch_size = plan.num_seqs
        self.dynamic_sample_loss_scale = plan.loss_scale
        self.sample_batch_size = 1

    def _add_short_step(self, strategy) -> None:
        """OpenRLHF's dynamic batching makes ``len(items) // local train batch`` optimizer steps and never
        trains the rest of the buffer: all of an epoch's short last rollout batch when it is smaller than
        a train batch (e.g. 2,000 prompts in batches of 128 leave 80), although it was generated and its
        step counted by the LR schedule's length. That rest becomes one more optimizer step, split as the
        host splits a step (its first-fit micro-batch count under the token budget, the largest over the
        ranks, and its balanced partitions) and normalised as the host normalises one (the step's
        sequences and action tokens over all ranks)."""
        from openrlhf.utils.seqlen_balancing import (
            get_minimum_num_micro_batch_size,
            get_seqlen_balanced_partitions,
        )

        args = strategy.args
        start = sum(len(indices) for indices in self.dynamic_indices)  # the host's steps take a prefix
        rest = list(range(start, len(self.items)))
        lengths = [int(self.items[i].total_length.item()) for i in rest]
        budget = (args.train.max_tokens_per_gpu, args.ds.ring_attn_size, args.ds.tensor_parallel_size)
        needed = get_minimum_num_micro_batch_size(lengths, *budget) if lengths else 0
        most, fewest, count = _reduce_max(strategy, [len(rest), -len(rest), needed])
        fewest = -fewest
        if most == 0:
            return
        if fewest < count:
            raise RuntimeError(
                f"the rollouts left after the full train batches ({fewest} to {most} per data-parallel rank) "
                f"cannot fill the {count} micro-batches every rank must run: make --rollout.batch_size x "
                "--rollout.n_samples_per_prompt a multiple of the data-parallel size, or the prompt count a "
                "multiple of --rollout.batch_size"
            )
        partitions = [
            [rest[k] for k in part] for part in get_seqlen_balanced_partitions(lengths, count, False)
        ]
        actions = [int(self.items[i].action_mask.sum()) for i in rest]
        live, tokens = _reduce_sum(strategy, [sum(a > 0 for a in actions), sum(actions)])
        self.dynamic_indices = self.dynamic_indices + partitions
        self.dynamic_sample_loss_scale = self.dynamic_sample_loss_scale + [
            len(p) / len(rest) for p in partitions
        ]
        self.dynamic_batch_num_tokens = self.dynamic_batch_num_tokens + [float(tokens)] * count
        self.dynamic_global_batch_size = self.dynamic_global_batch_size + [float(live)] * count
        self.dynamic_optimizer_step = self.dynamic_optimizer_step + [0] * (count - 1) + [1]
        self.sample_batch_size = 1

    @staticmethod
    def _check_equal_counts(strategy, count: int) -> None:
        """Every rank must run the same number of micro-batches (collective backward); fail loudly."""
        most, fewest = _reduce_max(strategy, [count, -count])
        if most != count or -fewest != count:
            raise RuntimeError(
                f"DPPO dispatch: this rank has {count} micro-batches, others between {-fewest} and "
                f"{most}; every rank must run the same number"
            )


def _all_reduce(strategy, t: torch.Tensor, op) -> torch.Tensor:
    """``t`` reduced over the data-parallel ranks, on the CPU (unchanged without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return t
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    t = t.to(device)
    dist.all_reduce(t, op=op, group=_get_dp_group(strategy))
    return t.cpu()


def _reduce_max(strategy, values: list[int]) -> list[int]:
    return [int(v) for v in _all_reduce(strategy, torch.tensor(values, dtype=torch.int64), dist.ReduceOp.MAX)]


def _reduce_sum(strategy, values: list[int]) -> list[int]:
    return [int(v) for v in _all_reduce(strategy, torch.tensor(values, dtype=torch.int64), dist.ReduceOp.SUM)]


def micro_batch_counts(experience) -> torch.Tensor:
    """(4,) float64: sequences and action tokens with a non-zero weight (trained), then with weight 0
    (fillers: forwarded, no gradient). A micro-batch without weights (GRPO) trains everything."""
    tokens = experience.action_mask.reshape(experience.action_mask.shape[0], -1).sum(-1).double()
    weights = _sequence_weights(experience)
    live = torch.ones_like(tokens, dtype=torch.bool) if weights is None else weights.cpu() != 0
    return torch.stack([live.sum().double(), tokens[live].sum(), (~live).sum().double(), tokens[~live].sum()])


COUNT_KEYS = (rd.SAMPLES_TRAINED, rd.TOKENS_TRAINED, rd.SAMPLES_FILLERS, rd.TOKENS_FILLERS)


def step_counts(counts: torch.Tensor, epochs: int, strategy) -> dict:
    """The step's ``COUNT_KEYS`` from this rank's summed ``micro_batch_counts`` (4,): per PPO epoch
    (every epoch visits every micro-batch once), summed over the data-parallel ranks."""
    counts = _all_reduce(strategy, counts.to(torch.float64) / epochs, dist.ReduceOp.SUM)
    return dict(zip(COUNT_KEYS, counts.tolist()))


def _sequence_weights(experience) -> torch.Tensor | None:
    w = experience.info.get(SAMPLE_WEIGHT)
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


class DPPOActorTrainer(ppo_actor.ActorPPOTrainer):
    """ActorPPOTrainer with the DPPO replay buffer and weighted KL-in-loss / entropy terms."""

    _counts = torch.zeros(4, dtype=torch.float64)  # micro_batch_counts summed since ppo_train began

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the host's NaiveReplayBuffer, built by the parent, replaced by a DPPO one with its settings
        self.replay_buffer: DPPOReplayBuffer = DPPOReplayBuffer.like(self.replay_buffer)

    def ppo_train(self, kl_ctl: float):
        if not self.args.train.dynamic_batch_enable:
            self._check_whole_micro_batches()
        self._counts = torch.zeros(4, dtype=torch.float64)
        status = super().ppo_train(kl_ctl)
        status.update(step_counts(self._counts, self.max_epochs, self.strategy))
        return status

    def _check_whole_micro_batches(self) -> None:
        """Without dynamic batching (GRPO only) the host's loader drops a last, partial micro-batch
        (``drop_last``): generated and never trained. Refused by name before any training."""
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
        self._counts = self._counts + micro_batch_counts(experience)
        weights = _sequence_weights(experience)
        if weights is None:
            return super().training_step(experience, kl_ctl, step, loss_batch_info)
        with weighted_aux_losses(weights):
            return super().training_step(experience, kl_ctl, step, loss_batch_info)


# The Python class behind the host's Ray actor: a class computed at run time, which mypy accepts as a
# base only when typed Any (the host is untyped, so it would be Any to mypy anyway).
_PolicyModelActorBase: Any = unwrap_actor_class(ppo_actor.PolicyModelActor)


class _DPPOPolicyModelActor(_PolicyModelActorBase):
    def init_model_from_pretrained(self, *args, **kwargs):
        with swap_attr(ppo_actor, "ActorPPOTrainer", DPPOActorTrainer):
            return super().init_model_from_pretrained(*args, **kwargs)


DPPOPolicyModelActor = remote_like(ppo_actor.PolicyModelActor, _DPPOPolicyModelActor)
