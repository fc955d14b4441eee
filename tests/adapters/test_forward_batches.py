"""DPPO's experience-side forward batches (``adapters.dispatch.forward_partitions``): never more batches
than samples, a multiple of the data-parallel size, each within the rollout token budget where the
samples allow, and no more forward calls than that budget requires."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openrlhf.utils.seqlen_balancing import get_minimum_num_micro_batch_size

from openrlhf_dppo.adapters.dispatch import forward_partitions


def _loads(lengths, parts):
    return [sum(lengths[i] for i in p) for p in parts]


def _valid(lengths, parts, dp):
    """What the host needs: every sample once, no empty batch, a multiple of dp batches, at least dp."""
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(parts) and len(parts) % dp == 0 and dp <= len(parts) <= len(lengths)


def test_a_count_of_samples_not_a_multiple_of_dp_under_a_tight_budget_gets_no_more_batches_than_samples():
    # 9 samples of 3,000 tokens, 4,096 a batch, 8 ranks: one sample a batch would be 9 batches, 16 when
    # rounded up to a multiple of 8 -- more than the 9 samples (the host asserts). The most there can be
    # is 8 (9 rounded down): seven batches of one sample and one of two (6,000 tokens, over the budget:
    # no multiple of 8 batches of 9 samples keeps every one within it).
    lengths = [3000] * 9
    parts = forward_partitions(lengths, (4096, 1, 1), 8)
    _valid(lengths, parts, 8)
    assert sorted(_loads(lengths, parts)) == [3000] * 7 + [6000]


def test_the_forward_calls_are_the_fewest_the_budget_allows():
    # 537 tokens under a budget of 100 need at least ceil(537 / 100) = 6 batches, and 6 bins of first-fit
    # decreasing hold them: [94], [91], [88, 10], [78, 13], [61, 19], [43, 40] (a multiple of dp 2). The
    # balanced partition into 6 leaves one over 100; the count must not then grow by dp (8 batches) but
    # keep 6 within the budget.
    lengths = [91, 78, 19, 40, 13, 94, 10, 88, 43, 61]
    parts = forward_partitions(lengths, (100, 1, 1), 2)
    _valid(lengths, parts, 2)
    assert len(parts) == 6 and max(_loads(lengths, parts)) <= 100


def test_a_sample_longer_than_the_budget_is_a_forward_batch_of_its_own():
    lengths = [5, 100_000, 5, 5]
    parts = forward_partitions(lengths, (4096, 1, 1), 2)
    assert sorted(parts) == [[0, 2, 3], [1]]
    # ring x TP multiply the budget: 100,000 fits 4,096 x 8 x 4 = 131,072 with the others, but dp 2 still
    # needs two batches
    assert len(forward_partitions(lengths, (4096, 8, 4), 2)) == 2


def test_fewer_samples_than_ranks_is_refused_by_name():
    with pytest.raises(ValueError, match="3 samples to forward on 4 data-parallel ranks"):
        forward_partitions([10, 10, 10], (64, 1, 1), 4)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    dp=st.sampled_from([1, 2, 3, 4, 8]),
    budget=st.integers(16, 400),
    ring=st.sampled_from([1, 2]),
)
def test_forward_partitions_properties(data, dp, budget, ring):
    """A sweep of sample counts (multiples of dp and not), lengths from short to over the budget."""
    capacity = budget * ring
    n = data.draw(st.integers(dp, 6 * dp + 5))
    lengths = data.draw(st.lists(st.integers(1, int(capacity * 1.3)), min_size=n, max_size=n))
    parts = forward_partitions(lengths, (budget, ring, 1), dp)
    _valid(lengths, parts, dp)
    fits = all(len(p) == 1 or load <= capacity for p, load in zip(parts, _loads(lengths, parts)))
    # the batches a packing within the budget needs: the host's own first fit over the lengths longest
    # first (first-fit decreasing; a sample over the budget alone), rounded up to a multiple of dp
    needed = get_minimum_num_micro_batch_size(sorted(lengths, reverse=True), budget, ring, 1)
    most = n // dp * dp  # no more batches than samples
    assert len(parts) <= min(max(dp, -(-needed // dp) * dp), most)  # no more forward calls than needed
    if -(-needed // dp) * dp <= most:
        assert fits  # within the budget wherever a multiple of dp batches within it is at hand
    if n % dp == 0:
        assert fits  # one sample a batch is always at hand then
    # never fewer than the budget's lower bound allows (rounded to dp, bounded by the samples)
    over = [x for x in lengths if x > capacity]
    lower = len(over) - (-(sum(lengths) - sum(over)) // capacity)
    assert len(parts) >= min(max(dp, -(-lower // dp) * dp), most) or not fits
    assert parts == forward_partitions(lengths, (budget, ring, 1), dp)  # deterministic


@pytest.mark.usefixtures("stand_in_ray")
@pytest.mark.parametrize("dp", [2, 4])
def test_both_arms_log_their_forward_batches_and_the_largest_per_step(dp):
    """The GRPO arm's are OpenRLHF's (its first-fit count rounded down to dp), DPPO's are
    ``forward_partitions``' (nothing pruned here, so both forward the same rollouts)."""
    from dppo_pipeline import args_for, dppo_maker, grpo_maker, make, tag
    from dppo_stand_ins import rollout_batch

    from openrlhf_dppo import metric_keys as K
    from openrlhf_dppo.core import DPPOConfig

    keep_all = DPPOConfig()  # nothing pruned: with a KL term in the reward not even the A == 0 completions
    budget = 64
    args = args_for(dp=dp, kl="reward", extra=("--rollout.max_tokens_per_gpu", str(budget)))
    G = args.rollout.n_samples_per_prompt
    lengths = [int(s.total_length.item()) for s in rollout_batch(8, G, seed=5, binary=False)]
    grpo, grpo_ctx = make(grpo_maker(args), tag(rollout_batch(8, G, seed=5, binary=False), G))
    dppo, dppo_ctx = make(
        dppo_maker(args, keep_all), tag(rollout_batch(8, G, seed=5, binary=False), G), drawn=8
    )
    host_count = max(dp, get_minimum_num_micro_batch_size(lengths, budget, 1, 1) // dp * dp)
    ours = forward_partitions(lengths, (budget, 1, 1), dp)
    for experiences, ctx, count in ((grpo, grpo_ctx, host_count), (dppo, dppo_ctx, len(ours))):
        tokens = [int(e.total_length.sum()) for e in experiences]
        assert ctx.metrics[K.FORWARD_BATCHES] == len(experiences) == count
        assert ctx.metrics[K.FORWARD_TOKENS_MAX] == max(tokens)
    assert dppo_ctx.metrics[K.FORWARD_TOKENS_MAX] <= budget < grpo_ctx.metrics[K.FORWARD_TOKENS_MAX]
