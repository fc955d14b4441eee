"""From the kept experiences of one rollout batch to per-rank packed micro-batches (``build_dispatch``,
under the full batch's normalisers divided by the optimizer steps: docs/METHOD.md, "When it is
unbiased", condition 3), and back on the ranks (``read_plan``); and the experience-side forward batches.
The plan travels in ``Experience.info`` under the private ``PLAN_*`` keys.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch
from openrlhf.utils.seqlen_balancing import get_seqlen_balanced_partitions

from openrlhf_dppo import metric_keys as K
from openrlhf_dppo.core import fitting_bins, micro_batch_capacity, pack
from openrlhf_dppo.core.packing import distribute

PLAN_MB = "_dppo_mb"  # micro-batch number on the rank (same numbering on every rank)
PLAN_STEP_END = "_dppo_step_end"  # 1.0 on the micro-batch that ends an optimizer step
PLAN_TOKENS = "_dppo_norm_tokens"  # batch_num_tokens of the step
PLAN_SEQS = "_dppo_norm_seqs"  # global_batch_size of the step
PLAN_SCALE = "_dppo_loss_scale"  # share of the rank's step items in this micro-batch (aux loss)
PLAN_KEYS = (PLAN_MB, PLAN_STEP_END, PLAN_TOKENS, PLAN_SEQS, PLAN_SCALE)
UNTRAINED_MB = -1  # PLAN_MB of an item no optimizer step trains (a draw that makes no step)
SHORT_BATCH_TRAIN = "_dppo_short_batch_train"  # GRPO items: 1.0 under --dppo.short_batch train
SAMPLE_WEIGHT = K.SAMPLE_WEIGHT  # w_j * v_ji per sequence; weights KL-in-loss / entropy


@dataclass
class DispatchPlan:
    """Per-rank item lists (in micro-batch order, plan keys set) and what the packing measured."""

    rank_items: list[list[Experience]]
    num_steps: int
    micro_batches_per_rank: int
    fillers: int
    metrics: dict = field(default_factory=dict)

    def rank_experiences(self) -> list[Experience]:
        """One batched Experience per rank, as ``RayActorGroup.async_run_method_batch`` expects."""
        return [make_experience_batch(items) for items in self.rank_items]


def planned_balance(experiences, args):
    """OpenRLHF's ``balance_experiences`` during a planned step: the per-rank batches of ``experiences.plan``."""
    plan = experiences.plan
    expected = sum(len(e.sequences) for e in experiences)
    planned = sum(len(items) for items in plan.rank_items) - plan.fillers
    if planned != expected:
        raise RuntimeError(f"DPPO dispatch plan covers {planned} sequences, the batch has {expected}")
    return plan.rank_experiences()


def mark_short_batch_rule(items: list[Experience], train_short: bool) -> None:
    """Marks GRPO's batched experiences, in place, with ``--dppo.short_batch train`` for the actors."""
    if train_short:
        for it in items:
            it.info[SHORT_BATCH_TRAIN] = torch.ones(len(it.sequences))


def pop_short_batch_rule(items: list[Experience]) -> bool:
    """True when the items were marked by ``mark_short_batch_rule(..., True)``; the key is removed."""
    marks = [it.info.pop(SHORT_BATCH_TRAIN, None) is not None for it in items]
    return any(marks)


def _zero_filler(item: Experience) -> Experience:
    filler = copy.copy(item)
    filler.info = dict(item.info)
    filler.advantages = torch.zeros_like(item.advantages)
    filler.info[SAMPLE_WEIGHT] = torch.zeros_like(torch.as_tensor(item.info[SAMPLE_WEIGHT]))
    return filler


def _with_plan(
    item: Experience, mb: int, step_end: bool, tokens: float, seqs: float, scale: float
) -> Experience:
    out = copy.copy(item)
    out.info = dict(item.info)
    out.info[PLAN_MB] = torch.tensor(float(mb))
    out.info[PLAN_STEP_END] = torch.tensor(1.0 if step_end else 0.0)
    out.info[PLAN_TOKENS] = torch.tensor(float(tokens), dtype=torch.float64)
    out.info[PLAN_SEQS] = torch.tensor(float(seqs), dtype=torch.float64)
    out.info[PLAN_SCALE] = torch.tensor(float(scale), dtype=torch.float64)
    return out


def build_dispatch(
    items: list[Experience],
    dp_size: int,
    capacity: int,
    num_steps: int,
    norm_tokens: float,
    norm_seqs: float,
) -> DispatchPlan:
    """Plan the training of the kept single-sample items (each with ``total_length`` and
    ``info[SAMPLE_WEIGHT]``). capacity: ``core.micro_batch_capacity``; num_steps: GRPO's optimizer steps;
    norm_tokens, norm_seqs: the full batch's Z_tok and Z_seq."""
    if not items:
        raise ValueError("nothing to dispatch: the kept set is empty")
    if num_steps == 0:
        return _untrained_plan(items, dp_size)
    steps = max(1, min(num_steps, len(items) // dp_size))
    chunks = np.array_split(np.arange(len(items)), steps)
    rank_items: list[list[Experience]] = [[] for _ in range(dp_size)]
    mb_counter, fillers, per_rank = 0, 0, 0
    agg = {"density_tokens": 0, "slots": 0, "micro_batches": 0, "lower": 0.0, "imbalance": 1.0, "empty": 0}
    for chunk in chunks:
        chunk_items = [items[int(i)] for i in chunk]
        lengths = [int(torch.as_tensor(it.total_length).reshape(-1)[0]) for it in chunk_items]
        plan, m = pack(lengths, capacity, dp_size)
        k = plan.micro_batches_per_rank
        shortest = chunk_items[int(np.argmin(lengths))]
        for r, micro_batches in enumerate(plan.rank_micro_batches):
            n_rank = sum(len(mb) for mb in micro_batches) or 1
            for j, mb in enumerate(micro_batches):
                members = [chunk_items[i] for i in mb]
                if not members:
                    members, fillers = [_zero_filler(shortest)], fillers + 1
                scale = len(mb) / n_rank
                for it in members:
                    rank_items[r].append(
                        _with_plan(
                            it, mb_counter + j, j == k - 1, norm_tokens / steps, norm_seqs / steps, scale
                        )
                    )
        mb_counter += k
        per_rank += k
        agg["density_tokens"] += sum(lengths)
        over = sum(max(0, n - capacity) for n in lengths)  # a longer sequence's slot: its length
        agg["slots"] += k * dp_size * capacity + over
        agg["lower"] += m[K.PACK_LOWER_BOUND]
        agg["imbalance"] = max(agg["imbalance"], m[K.PACK_RANK_IMBALANCE])
        agg["empty"] += m[K.PACK_EMPTY_MICRO_BATCHES]
    metrics = {
        K.PACK_DENSITY: agg["density_tokens"] / agg["slots"] if agg["slots"] else 0.0,
        K.PACK_MICRO_BATCHES: float(per_rank),
        K.PACK_LOWER_BOUND: float(agg["lower"]),
        K.PACK_RANK_IMBALANCE: float(agg["imbalance"]),
        K.PACK_EMPTY_MICRO_BATCHES: float(agg["empty"]),
        K.OPTIMIZER_STEPS: float(steps),
    }
    return DispatchPlan(rank_items, steps, per_rank, fillers, metrics)


def _untrained_plan(items: list[Experience], dp_size: int) -> DispatchPlan:
    """A draw that makes no optimizer step: its items to the ranks in turn, marked untrained."""
    rank_items: list[list[Experience]] = [[] for _ in range(dp_size)]
    for i, it in enumerate(items):
        rank_items[i % dp_size].append(_with_plan(it, UNTRAINED_MB, False, 0.0, 0.0, 0.0))
    metrics = {K.PACK_MICRO_BATCHES: 0.0, K.OPTIMIZER_STEPS: 0.0}
    return DispatchPlan(rank_items, 0, 0, 0, metrics)


@dataclass
class ReadPlan:
    """What a rank's replay buffer needs: micro-batch index lists and per-micro-batch settings."""

    indices: list[list[int]]
    step_end: list[int]
    num_tokens: list[float]
    num_seqs: list[float]
    loss_scale: list[float]


def read_plan(items: list[Experience]) -> ReadPlan | None:
    """Pop the plan keys from the items' info (in place) and group the items by micro-batch. None when
    no item carries a plan (GRPO); raises if only some do."""
    has = [PLAN_MB in it.info for it in items]
    if not any(has):
        return None
    if not all(has):
        raise RuntimeError("DPPO dispatch: some replay-buffer items carry no micro-batch plan")
    order: dict[int, list[int]] = {}
    settings: dict[int, tuple] = {}
    for idx, it in enumerate(items):
        vals = [float(torch.as_tensor(it.info.pop(key)).reshape(-1)[0]) for key in PLAN_KEYS]
        mb = int(vals[0])
        if mb == UNTRAINED_MB:
            continue
        order.setdefault(mb, []).append(idx)
        settings[mb] = tuple(vals[1:])
    mbs = sorted(order)
    if mbs != list(range(len(mbs))):
        raise RuntimeError(f"DPPO dispatch: micro-batch numbers are not contiguous: {mbs[:10]}...")
    return ReadPlan(
        indices=[order[m] for m in mbs],
        step_end=[int(settings[m][0]) for m in mbs],
        num_tokens=[settings[m][1] for m in mbs],
        num_seqs=[settings[m][2] for m in mbs],
        loss_scale=[settings[m][3] for m in mbs],
    )


def forward_partitions(lengths: list[int], budget: tuple[int, int, int], dp: int) -> list[list[int]]:
    """Index lists of the forward batches of ``lengths`` for ``dp`` ranks under ``budget`` =
    (``--rollout.max_tokens_per_gpu``, ring, TP), whose product C is a batch's token budget.

    k = min(max(dp, M rounded UP to a multiple of dp), n rounded DOWN to one) batches, none empty (the
    host needs a multiple of ``dp``: every rank the same number of forwards), M the bins of
    ``core.fitting_bins`` within C. OpenRLHF's balanced partitions into k when each is within C or one
    sample, else the M bins split to k (``core.packing.distribute``); only when k < M does a batch
    exceed C. Raises ValueError for fewer samples than ranks.
    """
    n = len(lengths)
    if n < dp:
        raise ValueError(f"{n} samples to forward on {dp} data-parallel ranks: each rank needs one")
    capacity = micro_batch_capacity(*budget)
    lens = np.asarray(lengths, dtype=np.int64)
    bins, loads = fitting_bins(lens, capacity)
    k = min(max(dp, -(-len(bins) // dp) * dp), n // dp * dp)
    parts = [sorted(p) for p in get_seqlen_balanced_partitions([int(x) for x in lens], k, False)]
    if k < len(bins) or all(len(p) == 1 or int(lens[p].sum()) <= capacity for p in parts):
        return parts
    ranks, _, _ = distribute(bins, loads, lens, k)  # k "ranks" of one micro-batch each: the bins split to k
    return [sorted(r[0]) for r in ranks]
