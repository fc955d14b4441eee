"""The samples generator with stand-in vLLM engines: only kept prompts reach vLLM, the samples carry
(dataset index, q), evaluation prompts are never pruned, unseen prompts are drawn at the mean seen score, the groups
dynamic filtering drops are handed on (not lost), generation is counted where it happens, and a
reward function that fails stops the run naming the file and the step."""

import pytest
import torch
from dppo_stand_ins import base_argv, generator_for, make_args, solved_every_4th

from openrlhf_dppo.adapters.step import RewardError
from openrlhf_dppo.core import DPPOConfig, PromptHistory, prompt_keep_probs, sample_mask, step_generator

pytestmark = pytest.mark.usefixtures("stand_in_ray")


def make_generator(cfg, n_prompts=12, batch=4, extra=(), seen=True, reward=solved_every_4th):
    args = make_args(base_argv(batch=batch) + list(extra))
    history = PromptHistory(n_prompts) if cfg.method == "dppo" else None
    # prompts 0..5 were seen: 0-2 always solved (score ~ 0), 3-5 half solved; 6.. never seen
    if seen and history is not None:
        history.update(torch.arange(6), torch.tensor([[1.0] * 4] * 3 + [[1.0, 0, 1, 0]] * 3), 0)
    gen, engine = generator_for(args, cfg, history, n_prompts, reward)
    return gen, engine, history


KW = dict(max_len=48, max_new_tokens=24, temperature=1.0, top_p=1.0)


def test_only_kept_prompts_reach_vllm_and_samples_carry_index_and_q():
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.1, seed=5)
    gen, engine, history = make_generator(cfg)
    samples, _, consumed, exhausted = gen.generate_samples(**KW)
    ctx = samples.ctx
    # the same decision recomputed with core: prompts 0..3 drawn, q from their history scores
    q, _ = prompt_keep_probs(history.signals(torch.arange(4), 4).score, 0.5, 0.1)
    mask, q_used = sample_mask(q, step_generator(5, 0, 0))
    kept = mask.nonzero().flatten().tolist()
    assert 0 < len(kept) < 4 and consumed == 4 and not exhausted
    assert sorted(engine.prompts) == sorted(f"question {k}" for k in kept)
    assert len(samples) == 4 * len(kept)
    for s in samples:
        draw = ctx.prompts[s.prompts[0]]
        assert s.prompts[0] == f"question {draw.index}"
        assert draw.q == pytest.approx(float(q_used[draw.index]), rel=1e-12)
    assert ctx.draw.drawn == 4 and ctx.draw.kept == len(kept)
    counts = {k: v for k, v in ctx.metrics.items() if not k.startswith("dppo/")}
    tokens = sum(int(s.action_mask.sum()) for s in samples)
    assert counts == {
        "prompts/drawn": 4.0,
        "prompts/rolled_out": float(len(kept)),
        "prompts/pruned": 4.0 - len(kept),
        "samples/generated": float(len(samples)),
        "tokens/generated": float(tokens),
        "samples/filtered": 0.0,
        "tokens/filtered": 0.0,
    }
    assert ctx.metrics["dppo/prompt_keep_frac"] == len(kept) / 4

    engine.prompts.clear()
    evals = gen.generate_eval_samples(**KW, n_samples_per_prompt=2)
    assert sorted(engine.prompts) == [f"eval {i}" for i in range(6)]  # evaluation is never pruned
    assert len(evals) == 12 and gen.draws == 1


def test_unseen_prompts_are_drawn_at_the_mean_seen_score_so_the_first_epoch_is_pruned():
    """All prompts unseen: each takes the same score (1 before any is seen), so 8 drawn give q = 0.5 each
    and exactly 4 rolled out (systematic); then seen and unseen prompts share one scale."""
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.1, seed=1)
    gen, engine, _ = make_generator(cfg, n_prompts=16, batch=8, seen=False)
    samples, _, consumed, _ = gen.generate_samples(**KW)
    ctx = samples.ctx
    assert consumed == 8 and ctx.draw.drawn == 8 and ctx.draw.kept == 4 == len(set(engine.prompts))
    assert {d.q for d in ctx.prompts.values()} == {0.5}
    assert ctx.metrics["dppo/prompt_unseen_frac"] == 1.0 and ctx.metrics["prompts/pruned"] == 4.0
    assert ctx.metrics["dppo/prompt_keep_frac_expected"] == pytest.approx(0.5)

    gen, _, history = make_generator(cfg, n_prompts=12, batch=12)  # prompts 6.. unseen
    samples, _, _, _ = gen.generate_samples(**KW)
    q = {d.index: d.q for d in samples.ctx.prompts.values()}
    scores = history.score(torch.arange(12), 4)
    scores[6:] = history.mean_seen_score(4)
    q_all, _ = prompt_keep_probs(scores, 0.5, 0.1)
    assert q and all(v == pytest.approx(float(q_all[i]), rel=1e-12) for i, v in q.items())
    assert any(i >= 6 for i in q) and all(float(q_all[i]) < 1.0 for i in range(6, 12))


@pytest.mark.parametrize("policy", ["proportional", "uniform"])
def test_the_prompt_policy_flag_chooses_the_keep_probabilities(policy):
    """--dppo.prompt_policy: the draw's q are the policy's over the history's scores, the same as core
    computes them."""
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.1, prompt_policy=policy, seed=3)
    gen, _, history = make_generator(cfg, n_prompts=12, batch=12)  # prompts 6.. unseen
    samples, _, _, _ = gen.generate_samples(**KW)
    q = {d.index: d.q for d in samples.ctx.prompts.values()}
    want, _ = prompt_keep_probs(history.signals(torch.arange(12), 4).score, 0.5, 0.1, policy)
    assert q and all(v == pytest.approx(float(want[i]), rel=1e-9) for i, v in q.items())
    if policy == "uniform":
        assert set(q.values()) == {0.5}
    else:  # the always-solved prompts 0-2 score below the half-solved 3-5
        assert float(want[0]) < float(want[3])


def test_an_exhausted_dataloader_ends_the_epoch_without_a_draw():
    gen, engine, _ = make_generator(DPPOConfig(prompt_prune_rate=0.5), n_prompts=4)
    gen.generate_samples(**KW)  # draws all 4 prompts
    samples, _, consumed, exhausted = gen.generate_samples(**KW)
    assert samples == [] and consumed == 0 and exhausted and gen.draws == 1


def test_dynamic_filtering_replacements_are_rolled_out_unpruned_and_dropped_groups_are_handed_on():
    cfg = DPPOConfig(prompt_prune_rate=0.25, q_min=0.1, seed=2)
    gen, engine, _ = make_generator(cfg, n_prompts=16, extra=["--algo.dynamic_filtering_enable"])
    samples, pass_rate, consumed, _ = gen.generate_samples(**KW)
    ctx = samples.ctx
    kept = ctx.draw.kept
    accepted = {s.prompts[0] for s in samples}
    assert all(int(p.split()[-1]) % 4 for p in accepted)  # all-solved groups were filtered out by OpenRLHF
    replacements = [p for p in engine.prompts if int(p.split()[-1]) >= 4]
    assert replacements and consumed == 4 + len(replacements) == ctx.draw.drawn
    assert ctx.draw.rolled_out == kept + len(replacements)
    for s in samples:
        if s.prompts[0] in replacements:
            assert ctx.prompts[s.prompts[0]].q == 1.0
    assert pass_rate == pytest.approx(len(samples) / consumed * 100)
    # every rolled-out prompt that is not in the returned batch is in ctx.filtered, whole and tagged
    dropped = sorted(set(engine.prompts) - accepted)
    assert dropped and sorted({s.prompts[0] for s in ctx.filtered}) == dropped
    assert len(ctx.filtered) == 4 * len(dropped) and all(int(s.rewards.item()) == 1 for s in ctx.filtered)
    assert [ctx.prompts[s.prompts[0]].index for s in ctx.filtered] == [
        int(s.prompts[0].split()[-1]) for s in ctx.filtered
    ]
    filtered_tokens = sum(int(s.action_mask.sum()) for s in ctx.filtered)
    assert ctx.metrics["samples/filtered"] == len(ctx.filtered)
    assert ctx.metrics["tokens/filtered"] == filtered_tokens
    assert ctx.metrics["samples/generated"] == len(samples) + len(ctx.filtered) == 4 * len(engine.prompts)
    assert ctx.metrics["tokens/generated"] == sum(int(s.action_mask.sum()) for s in samples) + filtered_tokens


def test_with_dppo_off_openrlhfs_generation_is_only_observed():
    """--dppo.method grpo: OpenRLHF's generate_samples and filter unchanged (every prompt rolled out,
    no tags' q below 1), the dropped groups handed on and every count taken."""
    gen, engine, _ = make_generator(
        DPPOConfig(method="grpo"), n_prompts=16, extra=["--algo.dynamic_filtering_enable"]
    )
    samples, _, consumed, _ = gen.generate_samples(**KW)
    ctx = samples.ctx
    assert engine.prompts[:4] == [f"question {i}" for i in range(4)]  # the batch, unpruned
    assert consumed == len(engine.prompts) and len(samples) == 16  # 4 accepted groups
    assert len(ctx.filtered) == 4 * (consumed - 4) > 0
    assert ctx.metrics["samples/generated"] == 4 * consumed
    assert ctx.metrics["prompts/drawn"] == ctx.metrics["prompts/rolled_out"] == consumed
    assert ctx.metrics["prompts/pruned"] == 0 and ctx.draw is None
    assert all(ctx.prompts[s.prompts[0]].q == 1.0 for s in samples + ctx.filtered)


def nan_at(prompt_number: int, value=float("nan")):
    def reward(prompt, i):
        return value if int(prompt.split()[-1]) == prompt_number and i == 1 else float(i % 2)

    return reward


@pytest.mark.parametrize("method", ["dppo", "grpo"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), None])
def test_a_reward_function_that_fails_stops_the_step_naming_the_file_and_the_step(method, value):
    # with dynamic filtering on, a NaN group mean is outside any range: OpenRLHF would drop the group
    # silently and draw a replacement; the check runs on every response, before the filter
    cfg = DPPOConfig(method=method)
    extra = ["--algo.dynamic_filtering_enable", "--reward.remote_url", "/data/my_reward.py"]
    gen, _, _ = make_generator(cfg, n_prompts=12, extra=extra, reward=nan_at(5, value))
    gen.steps = 6  # as a resume at step 6 sets it
    gen.generate_samples(**KW)  # prompts 0..3: fine (step 7)
    what = "no reward" if value is None else "non-finite reward"
    with pytest.raises(RewardError, match=rf"^/data/my_reward.py.*{what}.*'question 5' at step 8"):
        gen.generate_samples(**KW)


def test_a_failing_reward_during_evaluation_is_reported_as_such():
    def reward(prompt, i):
        return None if prompt == "eval 3" else 1.0

    gen, _, _ = make_generator(DPPOConfig(), reward=reward)
    with pytest.raises(RewardError, match=r"^reward.py: no reward .*'eval 3' during the evaluation"):
        gen.generate_eval_samples(**KW, n_samples_per_prompt=2)


# ---- GRESO (--dppo.method greso) -------------------------------------------------------------------------


def _greso_generator(seed=3):
    """16 prompts, B = 4, G = 4, dynamic filtering on (every 4th prompt is all-solved: filtered out)."""
    cfg = DPPOConfig(method="greso", seed=seed)
    gen, engine, _ = make_generator(cfg, n_prompts=16, batch=4, extra=["--algo.dynamic_filtering_enable"])
    return gen, engine


def _greso_steps(gen, engine, n):
    """n steps (an exhausted answer ends an epoch and is not a step): [(ctx, prompts sent to vLLM, the
    step's draw number)]."""
    out = []
    while len(out) < n:
        engine.prompts.clear()
        draw = gen.draws
        samples, _, _, exhausted = gen.generate_samples(**KW)
        if samples:
            out.append((samples.ctx, list(engine.prompts), draw))
        else:
            assert exhausted
    return out


def test_greso_first_pass_skips_nothing_and_the_streaks_learn_from_every_rolled_out_group():
    gen, engine = _greso_generator()
    steps = _greso_steps(gen, engine, 3)  # the first pass: 16 prompts, 4 filtered and replaced
    assert sum(ctx.metrics["prompts/drawn"] for ctx, _, _ in steps) == 16
    for ctx, sent, _ in steps:
        m = ctx.metrics
        assert m["prompts/pruned"] == 0 and m["prompts/drawn"] == m["prompts/rolled_out"] == len(sent)
        assert (m["greso/p_easy"], m["greso/p_hard"], m["greso/adapted"]) == (0.5, 0.5, 0.0)
        assert m["greso/hard_share"] == 0.0
        assert m["greso/easy_share"] == sum(int(p.split()[-1]) % 4 == 0 for p in sent) / len(sent)
        assert {d.q for d in ctx.prompts.values()} == {1.0}
    z_easy, z_hard = gen.streaks.streaks(torch.arange(16))
    assert z_easy.tolist() == [int(i % 4 == 0) for i in range(16)] and z_hard.tolist() == [0] * 16
    assert (gen.greso_control.p_easy, gen.greso_control.p_hard) == (0.5, 0.5)  # not adapted yet


def test_greso_second_pass_skips_by_the_streaks_with_seeded_draws_and_adapts_p():
    gen, engine = _greso_generator()
    _greso_steps(gen, engine, 3)  # the first pass: prompts 0, 4, 8, 12 all solved once (z_easy 1)
    steps = _greso_steps(gen, engine, 2)
    position, skipped = 0, 0
    for ctx, sent, draw in steps:
        m = ctx.metrics
        drawn = int(m["prompts/drawn"])
        assert drawn == m["prompts/rolled_out"] + m["prompts/pruned"] and m["prompts/rolled_out"] == len(sent)
        # the skip recomputed: one uniform per drawn prompt, in order, from the stream (seed, draw); an
        # all-solved prompt is kept with p_easy ** 1, the others always
        u = torch.rand(drawn, generator=step_generator(3, draw, 0), dtype=torch.float64).tolist()
        keep = {i: m["greso/p_easy"] if i % 4 == 0 else 1.0 for i in range(position, position + drawn)}
        assert sent == [f"question {i}" for (i, k), x in zip(keep.items(), u) if x < k]
        assert all(ctx.prompts[p].q == keep[int(p.split()[-1])] for p in sent)
        skipped += drawn - len(sent)
        position += drawn
        assert m["greso/adapted"] == 1.0  # the second pass adapts p_easy, p_hard
    assert skipped > 0  # seed 3 skips some of the all-solved prompts
    # each step moves p by 0.01 from the step's shares: easy down at >= alpha / 3; hard (none) up
    p_easy = [ctx.metrics["greso/p_easy"] for ctx, _, _ in steps] + [gen.greso_control.p_easy]
    p_hard = [ctx.metrics["greso/p_hard"] for ctx, _, _ in steps] + [gen.greso_control.p_hard]
    assert p_easy[0] == p_hard[0] == 0.5
    for k, (ctx, _, _) in enumerate(steps):
        down = ctx.metrics["greso/easy_share"] >= 0.25 / 3
        assert p_easy[k + 1] == pytest.approx(p_easy[k] - 0.01 if down else p_easy[k] + 0.01)
        assert p_hard[k + 1] == pytest.approx(p_hard[k] + 0.01)


def test_greso_state_round_trips_and_a_resumed_generator_repeats_the_draws():
    gen, engine = _greso_generator()
    _greso_steps(gen, engine, 3)  # the first pass; its dataloader is at the end
    state = gen.dppo_state_dict()
    resumed, resumed_engine = _greso_generator()  # a fresh dataloader: the second pass's start
    resumed.load_dppo_state(state)
    assert resumed.draws == gen.draws and resumed.greso_control.state_dict() == gen.greso_control.state_dict()
    for name in ("z_easy", "z_hard", "rollouts"):
        assert torch.equal(getattr(resumed.streaks, name), getattr(gen.streaks, name))
    ahead = [(ctx.metrics, sent) for ctx, sent, _ in _greso_steps(gen, engine, 2)]
    assert ahead == [(ctx.metrics, sent) for ctx, sent, _ in _greso_steps(resumed, resumed_engine, 2)]
    dppo_gen, _, _ = make_generator(DPPOConfig())
    with pytest.raises(ValueError, match="--dppo.method"):
        dppo_gen.load_dppo_state(state)
    with pytest.raises(ValueError, match="--dppo.method"):
        resumed.load_dppo_state(dppo_gen.dppo_state_dict())


# ---- CPPO (--dppo.method cppo) ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch,rate,drawn", [(4, 0.5, 8), (3, 0.25, 4), (3, 0.7, 10)])
def test_cppo_rolls_out_int_b_over_one_minus_p_prompts_none_pruned(batch, rate, drawn):
    """CPPO's step draws int(B / (1 - P)) prompts and rolls every one out with q = 1: no prompt history,
    no draw stream; the counts say so (prompts/pruned 0, dppo/prompt_keep_frac 1)."""
    cfg = DPPOConfig(method="cppo", completion_prune_rate=rate)
    gen, engine, history = make_generator(cfg, n_prompts=24, batch=batch, extra=["--train.batch_size", "4"])
    assert history is None and gen.history is None
    samples, _, consumed, exhausted = gen.generate_samples(**KW)
    ctx = samples.ctx
    assert consumed == drawn and not exhausted
    assert sorted(engine.prompts) == sorted(f"question {i}" for i in range(drawn))
    assert len(samples) == 4 * drawn and {d.q for d in ctx.prompts.values()} == {1.0}
    assert (ctx.draw.drawn, ctx.draw.kept, ctx.draw.rolled_out) == (drawn, drawn, drawn)
    m = ctx.metrics
    assert (m["prompts/drawn"], m["prompts/rolled_out"], m["prompts/pruned"]) == (drawn, drawn, 0.0)
    assert m["dppo/prompt_keep_frac"] == 1.0 and m["samples/generated"] == 4 * drawn
    assert gen.draws == 0  # no random prompt draw was made
    engine.prompts.clear()
    samples, _, consumed, _ = gen.generate_samples(**KW)  # the next step takes the next prompts
    assert consumed == drawn and sorted(engine.prompts) == sorted(
        f"question {i}" for i in range(drawn, 2 * drawn)
    )
