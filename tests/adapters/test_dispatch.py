"""The dispatch plan: packed micro-batches valid for OpenRLHF's replay buffer, equal counts per rank,
packed loss == padded loss per optimizer step, zero-weight fillers, and two real gloo ranks."""

import copy
import socket
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from dppo_pipeline import make, tag
from dppo_stand_ins import (
    StandInGroup,
    StandInTokenizer,
    base_argv,
    logprob_fn,
    make_args,
    rollout_batch,
)
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ppo_utils.experience import make_experience_batch, split_experience_batch
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from openrlhf_dppo.adapters.actor import DPPOReplayBuffer
from openrlhf_dppo.adapters.dispatch import PLAN_KEYS, SAMPLE_WEIGHT, build_dispatch
from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker
from openrlhf_dppo.core import DPPOConfig, PromptHistory

ACTOR = logprob_fn(0.01, 0.05, 5)


pytestmark = pytest.mark.usefixtures("stand_in_ray")


def kept_batch(dp=2, train_batch=16, prune=0.4, n_prompts=8, seed=21, extra=(), actor=ACTOR):
    argv = base_argv(dp=dp, batch=n_prompts, train_batch=train_batch) + [*extra]
    args = make_args(argv)
    G = args.rollout.n_samples_per_prompt
    samples = rollout_batch(n_prompts, G, seed=seed, binary=False)
    cfg = DPPOConfig(completion_prune_rate=prune, p_min=0.2, seed=seed)
    maker = DPPOExperienceMaker(StandInGroup(actor, dp), None, None, None, FixedKLController(0.0),
                                SimpleNamespace(args=args), StandInTokenizer(), dppo=cfg,
                                history=PromptHistory(n_prompts))  # fmt: skip
    experiences, ctx = make(maker, tag(samples, G))
    return maker, experiences, ctx


def loss_of(exp, batch_num_tokens, theta):
    feature = (exp.sequences[:, 1:] % 3).float() - 1.0
    new = exp.action_log_probs + theta * feature * exp.action_mask
    return PolicyLoss()(new, exp.action_log_probs, exp.advantages, exp.action_mask,
                        batch_num_tokens=batch_num_tokens)[0]  # fmt: skip


def buffers_for(plan, args):
    out = []
    for rank_exp in plan.rank_experiences():
        buffer = DPPOReplayBuffer(1, 0, True, True, True)
        buffer.append(rank_exp)
        buffer.setup_dynamic_batch(SimpleNamespace(args=args))
        out.append(buffer)
    return out


def test_micro_batches_are_valid_equal_per_rank_and_packed_loss_equals_padded_loss():
    maker, experiences, ctx = kept_batch(train_batch=8)
    args, plan = maker.args, experiences.plan
    kept = sum(len(e.index) for e in experiences)
    assert plan.num_steps == min(8 * 4 // 8, kept // 2) > 1  # GRPO's step count, kept every step
    buffers = buffers_for(plan, args)
    assert len({len(b) for b in buffers}) == 1 and len(buffers[0]) == plan.micro_batches_per_rank
    seen = []
    z = ctx.metrics["dppo/normalizer_tokens"]
    theta = torch.tensor(0.25)
    packed_per_step, step_items = [0.0] * plan.num_steps, [[] for _ in range(plan.num_steps)]
    for buffer in buffers:
        step = 0
        assert sum(buffer.dynamic_optimizer_step) == plan.num_steps
        for m in range(len(buffer)):
            items = buffer[m]
            mb = buffer.collate_fn([items])
            assert not any(k in mb.info for k in PLAN_KEYS)  # the plan is never logged
            assert int(mb.attention_mask.sum()) <= args.train.max_tokens_per_gpu
            assert buffer.dynamic_batch_num_tokens[m] == pytest.approx(z / plan.num_steps, rel=1e-12)
            packed_per_step[step] = packed_per_step[step] + loss_of(
                mb, buffer.dynamic_batch_num_tokens[m], theta
            )
            step_items[step].extend(items)
            seen.extend(it.sequences.tolist() for it in items)
            step += buffer.dynamic_optimizer_step[m]
    expected = sorted(
        row[: int(m.sum())].tolist() for e in experiences for row, m in zip(e.sequences, e.attention_mask)
    )
    assert sorted(seen) == expected  # every kept sequence exactly once
    for s in range(plan.num_steps):  # packed == one padded batch of the step's items, same normaliser
        padded = make_experience_batch(step_items[s])
        torch.testing.assert_close(
            packed_per_step[s], loss_of(padded, z / plan.num_steps, theta), rtol=1e-6, atol=1e-8
        )


def test_an_empty_micro_batch_gets_a_zero_weight_filler_that_adds_nothing():
    maker, experiences, _ = kept_batch(dp=2, prune=0.0, n_prompts=2, train_batch=8)
    items = maker._single_items(experiences)[:1]  # one sequence for two ranks
    plan = build_dispatch(items, 2, 64, 1, 10.0, 8.0)
    assert plan.fillers == 1 and plan.micro_batches_per_rank == 1
    theta = torch.tensor(0.4, requires_grad=True)
    buffers = buffers_for(plan, maker.args)
    losses = [loss_of(b.collate_fn([b[0]]), b.dynamic_batch_num_tokens[0], theta) for b in buffers]
    filler = [b for b in buffers if float(b.items[0].info[SAMPLE_WEIGHT]) == 0.0]
    assert len(filler) == 1 and torch.count_nonzero(filler[0].items[0].advantages) == 0
    total = losses[0] + losses[1]
    real = loss_of(make_experience_batch(items), 10.0, theta)
    torch.testing.assert_close(total, real, rtol=0, atol=0)
    (g_total,) = torch.autograd.grad(total, theta)
    (g_real,) = torch.autograd.grad(real, theta)
    assert g_total == g_real


def test_a_sequence_longer_than_the_budget_trains_in_a_micro_batch_of_its_own():
    """As OpenRLHF's dynamic batch trains it (its first fit opens a micro-batch nothing else enters)."""
    maker, experiences, _ = kept_batch(dp=2, prune=0.0, n_prompts=2, train_batch=8)
    items = maker._single_items(experiences)
    lengths = [int(it.total_length) for it in items]
    capacity = max(lengths) - 1  # the longest is over it
    plan = build_dispatch(items, 2, capacity, 1, 1.0, 1.0)
    micro_batches: dict = {}
    for r, rank in enumerate(plan.rank_items):  # micro-batch m of rank r: key (r, m)
        for it in rank:
            micro_batches.setdefault((r, float(it.info[PLAN_KEYS[0]])), []).append(int(it.total_length))
    assert sorted(n for mb in micro_batches.values() for n in mb) == sorted(lengths)
    alone = [len(mb) for mb in micro_batches.values() if max(mb) > capacity]
    assert alone == [1] * lengths.count(max(lengths))
    assert all(sum(mb) <= capacity for mb in micro_batches.values() if max(mb) <= capacity)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_run_equal_micro_batch_counts_and_the_full_batch_loss(tmp_path):
    """Two real processes (gloo): each follows its share of the plan through the DPPO replay buffer and
    OpenRLHF's get_loss_batch_info (dp_size 2 from the group); DeepSpeed's rank averaging of the summed
    micro-batch losses gives the single-process total. A plan with unequal counts fails on both ranks."""
    import dppo_gloo_worker

    maker, experiences, ctx = kept_batch(dp=2, train_batch=8)
    plan = experiences.plan
    theta = 0.25
    expected = 0.0
    for buffer in buffers_for(copy.deepcopy(plan), maker.args):
        for m in range(len(buffer)):
            expected += float(
                loss_of(buffer.collate_fn([buffer[m]]), buffer.dynamic_batch_num_tokens[m], theta)
            )
    payload = tmp_path / "plan.pt"
    torch.save({"ranks": plan.rank_experiences(), "theta": theta}, payload)
    assert sys.modules.get("dppo_gloo_worker") is dppo_gloo_worker
    mp.spawn(dppo_gloo_worker.run, args=(2, _free_port(), str(payload), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    items = [it for rank in plan.rank_items for it in rank]
    live = [it for it in items if float(it.info[SAMPLE_WEIGHT]) != 0]
    want = {
        "samples/trained": float(len(live)),
        "tokens/trained": float(sum(int(it.action_mask.sum()) for it in live)),
        "samples/fillers": float(len(items) - len(live)),
        "tokens/fillers": float(
            sum(int(it.action_mask.sum()) for it in items) - sum(int(it.action_mask.sum()) for it in live)
        ),
        "samples/untrained": 0.0,  # the plan trains every item it holds
        "tokens/untrained": 0.0,
    }
    assert want["samples/trained"] == sum(len(e.index) for e in experiences)
    for r, res in enumerate(results):
        assert res["counts"] == want, r  # every rank holds the sum over both
        assert res["micro_batches"] == plan.micro_batches_per_rank, r
        assert abs(res["loss"] - expected) < 1e-6 * max(1.0, abs(expected)), (res["loss"], expected)
        assert "every rank must run the same number" in res["unequal_error"], r


@pytest.mark.parametrize(
    "rule, n_prompts, dp, train_batch, host_steps, ours_steps",
    [
        ("drop", 5, 2, 32, 0, 0),  # a short batch smaller than a train batch: OpenRLHF trains none of it
        ("drop", 6, 2, 16, 1, 1),  # a full rollout batch of 6 x 4 with a rest: one step, as OpenRLHF
        ("drop", 5, 3, 18, 1, 1),  # dp 3, 20 rollouts (7, 7, 6 per rank): OpenRLHF's step, no error
        ("train", 5, 2, 32, 0, 1),  # --dppo.short_batch train: that short batch is one step
        ("train", 6, 2, 16, 1, 1),  # ... and only that: a rest after whole train batches is no extra step
    ],
    ids=lambda v: str(v),
)
def test_grpo_takes_openrlhfs_optimizer_steps_and_counts_the_rest_untrained_on_gloo_ranks(
    tmp_path, rule, n_prompts, dp, train_batch, host_steps, ours_steps
):
    """GRPO (no plan) through the DPPO buffer and OpenRLHF's on ``dp`` gloo ranks: a rollout batch of
    ``n_prompts`` x 4 where the recipe's batch holds 8 (6 x 4 is the full batch of the issue's first case).
    Under ``drop`` the DPPO buffer makes OpenRLHF's steps with OpenRLHF's micro-batches; what they leave
    is counted as untrained, so trained + untrained is every rollout. Under ``train`` a batch smaller than
    one train batch becomes one step of all its rollouts with the host's normalisers (the summed loss is
    the token-mean loss of the batch); a rest after whole train batches stays untrained."""
    import dppo_gloo_worker
    from openrlhf.trainer.ppo_utils.experience import balance_experiences

    from openrlhf_dppo.adapters.experience_maker import CountingExperienceMaker

    batch = max(n_prompts, 8) if n_prompts != 6 else 6
    args = make_args(base_argv(dp=dp, batch=batch, train_batch=train_batch))
    G = args.rollout.n_samples_per_prompt
    maker = CountingExperienceMaker(StandInGroup(ACTOR, 1), None, None, None, FixedKLController(0.0),
                                    SimpleNamespace(args=args), StandInTokenizer(), short_batch=rule)  # fmt: skip
    experiences, ctx = make(maker, tag(rollout_batch(n_prompts, G, seed=3, binary=False), G))
    assert "samples/trained" not in ctx.metrics and ctx.metrics["samples/pruned"] == 0  # the actors count
    ranks = balance_experiences(experiences, args)
    items = [it for e in ranks for it in split_experience_batch(e)]
    n = len(items)
    theta = 0.25
    payload = tmp_path / "grpo.pt"
    torch.save({"ranks": ranks, "args": args, "theta": theta}, payload)
    mp.spawn(
        dppo_gloo_worker.run_grpo, args=(dp, _free_port(), str(payload), str(tmp_path)), nprocs=dp, join=True
    )
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(dp)]
    tokens = float(sum(int(it.action_mask.sum()) for it in items))
    for r, res in enumerate(results):
        host, ours = res["host"], res["dppo"]
        assert ours["held"] == host["held"], r
        assert host["optimizer_steps"] == host_steps, r
        assert ours["optimizer_steps"] == ours_steps, r
        trained = ours["counts"]["samples/trained"]
        assert trained + ours["counts"]["samples/untrained"] == n, r  # every rollout, counted once
        assert ours["counts"]["tokens/trained"] + ours["counts"]["tokens/untrained"] == tokens, r
        if ours_steps == host_steps:  # OpenRLHF's micro-batches, normalisers and loss, exactly
            assert ours["seen"] == host["seen"] and ours["num_tokens"] == host["num_tokens"], r
            assert ours["num_seqs"] == host["num_seqs"] and ours["loss"] == host["loss"], r
            assert trained == sum(len(x["dppo"]["seen"]) for x in results), r
        assert ours["micro_batches"] == results[0]["dppo"]["micro_batches"], r  # equal counts
    if ours_steps != host_steps:  # one step of all n rollouts: the host's normalisers of a whole batch
        assert results[0]["dppo"]["num_tokens"] == [tokens] * results[0]["dppo"]["micro_batches"]
        assert results[0]["dppo"]["num_seqs"] == [float(n)] * results[0]["dppo"]["micro_batches"]
        assert results[0]["dppo"]["counts"]["samples/untrained"] == 0
        expected = float(loss_of(make_experience_batch(items), tokens, theta))
        for res in results:
            assert res["dppo"]["loss"] == pytest.approx(expected, rel=1e-6), (res["dppo"]["loss"], expected)


@pytest.mark.parametrize("dp", [2, 4])
def test_the_experience_side_forwards_stay_within_the_rollout_token_budget(dp):
    """OpenRLHF's ``split_rollout_samples`` rounds the first-fit count of forward batches DOWN to a
    multiple of dp (9 -> 8, 7 -> 4), so a batch can hold far more than --rollout.max_tokens_per_gpu;
    DPPO's planned forwards round up: a multiple of dp batches, each within the budget, every kept
    completion forwarded once."""
    from openrlhf.utils.seqlen_balancing import (
        get_minimum_num_micro_batch_size,
        get_seqlen_balanced_partitions,
    )

    from openrlhf_dppo.adapters.dispatch import forward_partitions

    budget = 64
    over = 0
    for seed in range(12):  # the host's rule on the same lengths: over the budget for some of them
        lengths = [int(s.total_length.item()) for s in rollout_batch(8, 4, seed=seed, binary=False)]
        k = max(dp, get_minimum_num_micro_batch_size(lengths, budget, 1, 1) // dp * dp)
        host = get_seqlen_balanced_partitions(lengths, k, False)
        over += max(sum(lengths[i] for i in p) for p in host) > budget
        ours = forward_partitions(lengths, (budget, 1, 1), dp)
        assert len(ours) % dp == 0 and sorted(i for p in ours for i in p) == list(range(len(lengths)))
        assert max(sum(lengths[i] for i in p) for p in ours) <= budget, seed
    assert over >= 4  # so the check above has teeth

    batches, rows = [], []

    def recording(sequences, action_mask, attention_mask, **kw):
        batches.append(int(attention_mask.sum()))
        rows.append(len(sequences))
        return ACTOR(sequences, action_mask, attention_mask, **kw)

    extra = ("--rollout.max_tokens_per_gpu", str(budget))
    _, experiences, _ = kept_batch(dp=dp, prune=0.0, seed=5, extra=extra, actor=recording)
    assert batches and len(batches) % dp == 0 and max(batches) <= budget
    assert sum(rows) == sum(len(e.sequences) for e in experiences)  # each kept completion once


def test_a_draw_rolled_out_to_fewer_completions_than_ranks_trains_them_beside_zero_weight_copies():
    """A draw of 4 prompts x 4 (one train batch of 16) of which prompt pruning kept one (q = 0.25): 4
    rollouts for 8 ranks. GRPO would make one step of the batch, and so does DPPO's plan, every rank
    forwarding and running one sequence: the 4 kept and 4 zero-weight copies of the shortest. The step's
    loss is that of the 4 kept under the full batch's normaliser; the copies count as fillers, never as
    trained, and were never generated."""
    from openrlhf_dppo.adapters.actor import micro_batch_counts

    args = make_args(base_argv(dp=8, batch=4, train_batch=16))
    G = args.rollout.n_samples_per_prompt
    forward = StandInGroup(ACTOR, 8)  # asserts one forward batch per rank at least, as RayActorGroup does
    maker = DPPOExperienceMaker(forward, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                StandInTokenizer(), dppo=DPPOConfig(), history=PromptHistory(4))  # fmt: skip
    samples = rollout_batch(1, G, seed=7, binary=False)
    experiences, ctx = make(maker, tag(samples, G, q=[0.25]), drawn=4)
    plan = experiences.plan
    assert plan.num_steps == 1 and [len(items) for items in plan.rank_items] == [1] * 8
    assert forward.forwarded == 8 and ctx.metrics["dppo/completion_fillers"] == 4
    assert ctx.metrics["samples/pruned"] == 0
    real = [it for items in plan.rank_items for it in items if float(it.info[SAMPLE_WEIGHT]) != 0]
    assert sorted(it.sequences.tolist() for it in real) == sorted(s.sequences[0].tolist() for s in samples)
    buffers = buffers_for(plan, args)
    counts = sum(micro_batch_counts(b.collate_fn([b[0]])) for b in buffers)
    tokens = sum(int(s.action_mask.sum()) for s in samples)
    assert counts[0] == 4 and counts[1] == tokens and counts[2] == 4  # trained: the 4 kept; fillers: 4
    assert all(b.untrained_counts() == [0, 0] for b in buffers)
    theta = torch.tensor(0.3)
    z = ctx.metrics["dppo/normalizer_tokens"]
    total = sum(loss_of(b.collate_fn([b[0]]), b.dynamic_batch_num_tokens[0], theta) for b in buffers)
    torch.testing.assert_close(total, loss_of(make_experience_batch(real), z, theta), rtol=1e-6, atol=1e-8)
