"""The trainer over a run: evaluation lines, --dppo.max_steps and the evaluation points (step 0, the
schedule, the last step), an episode's optimizer steps against the LR schedule, and the training reward
(raw, Horvitz-Thompson)."""

import json
import os
from types import SimpleNamespace

import pytest
import torch
from dppo_pipeline import CheckpointGroup, bare_trainer, controller, one_step, schedule_of
from dppo_stand_ins import GENERATE_KW, base_argv, generator_for, make_args

from openrlhf_dppo.core import DPPOConfig, PromptHistory
from openrlhf_dppo.run_dir import RunDir

pytestmark = pytest.mark.usefixtures("stand_in_ray")


def test_evaluation_lines_go_to_the_metrics_file(tmp_path):
    from openrlhf.trainer.ppo_utils.experience import Experience

    args = make_args(base_argv())
    t = bare_trainer(args, DPPOConfig(), RunDir(str(tmp_path / "run")), CheckpointGroup())
    rewards = [1.0, 0.0, 1.0, 1.0]
    evals = [Experience(prompts=["p"], rewards=r, response_length=torch.tensor([3]), truncated=torch.tensor([0]))
             for r in rewards]  # fmt: skip
    t.samples_generator = SimpleNamespace(generate_eval_samples=lambda **kw: evals)
    t.eval_dataloader = [(["math"], ["p"], [""], [None])]
    logs = t.evaluate(5, n_samples_per_prompt=4, temperature=0.6)
    (line,) = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert line["kind"] == "eval" and line["step"] == 5
    assert line["eval_math_pass1"] == logs["eval_math_pass1"] == 0.75 and line["eval_math_pass4"] == 1.0


# ---- the run's length and its evaluation points -----------------------------------------------------


class StandInLoader(list):
    def state_dict(self):
        return {}


def looping_trainer(tmp_path, method, step_limit, extra=(), states=None):
    """A trainer whose OpenRLHF loop runs with the real samples generator over 64 prompts (16 steps an
    episode, 3 episodes: the prompts alone would not stop it) and a stand-in step that records the
    step number of the context each rollout batch carries."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    argv = base_argv() + [
        "--train.num_episodes",
        "3",
        "--eval.steps",
        "2",
        "--ckpt.path",
        str(tmp_path / "ckpt"),
    ]
    args = make_args(argv + list(extra))
    cfg = DPPOConfig(method=method)
    group = CheckpointGroup(states)
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "run")), group)
    evals = [Experience(prompts=["p"], rewards=r, response_length=torch.tensor([3]), truncated=torch.tensor([0]))
             for r in (1.0, 0.0, 0.0, 1.0)]  # fmt: skip
    t.history = PromptHistory(64) if method == "dppo" else None
    t.samples_generator, _ = generator_for(args, cfg, t.history, 64, step_limit=step_limit)
    t.samples_generator.generate_eval_samples = lambda **kwargs: evals
    t.eval_dataloader = [(["math"], ["p"], [""], [None])]
    t.prompts_dataloader = StandInLoader(range(64))
    t.generate_kwargs = dict(GENERATE_KW)
    t.broadcast_to_vllm = lambda: None
    t.steps_seen = []

    def train_step(rollouts, step):
        t.steps_seen.append(rollouts.ctx.step)
        return {"timing/make_experience": 0.01}, step + 1

    t.train_step = train_step
    return t


def lines(tmp_path, kind):
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    return [r for r in rows if r["kind"] == kind]


@pytest.mark.parametrize("method", ["dppo", "grpo"])
def test_max_steps_ends_the_run_after_the_last_steps_evaluation(tmp_path, method):
    t = looping_trainer(tmp_path, method, step_limit=5)
    t.step_limit = 5
    t.fit()
    assert [r["step"] for r in lines(tmp_path, "train")] == [1, 2, 3, 4, 5]
    assert t.steps_seen == [1, 2, 3, 4, 5]  # the exhausted answers generate nothing
    evals = lines(tmp_path, "eval")
    assert [r["step"] for r in evals] == [0, 2, 4]  # a fresh run starts with an evaluation at step 0
    assert all(r["timing/eval"] >= 0 and r["eval_math_pass1"] == 0.5 for r in evals)
    status = json.load(open(tmp_path / "run" / "status.json"))
    assert status["state"] == "finished" and status["step"] == 5


def test_the_last_step_is_evaluated_when_it_is_on_the_schedule_and_a_resume_skips_step_0(tmp_path):
    os.makedirs(tmp_path / "ckpt" / "_actor")
    states = {"episode": 0, "global_step": 2, "total_consumed_prompts": 8, "data_loader_state_dict": {}}
    t = looping_trainer(tmp_path, "dppo", 4, ["--ckpt.load_enable"], states=states)
    t.step_limit = 4
    t.fit()
    assert [r["step"] for r in lines(tmp_path, "train")] == [3, 4] == t.steps_seen
    assert [r["step"] for r in lines(tmp_path, "eval")] == [4]


def test_an_episode_of_short_batches_makes_as_many_optimizer_steps_as_the_schedule_spans(tmp_path):
    """The reproduction: 64 prompts, B = 4, G = 4, train batch 32, --dppo.short_batch train. One episode
    through the real generator, experience maker, dispatch plan and replay buffers makes one optimizer
    step per rollout batch: 16, all within the schedule (which OpenRLHF's count alone makes 8)."""
    cfg = DPPOConfig(short_batch="train")
    t = controller(
        tmp_path,
        cfg,
        batch=4,
        n_prompts=64,
        extra=["--train.batch_size", "32", "--dppo.short_batch", "train"],
    )
    made = [one_step(t)[0]["dppo/optimizer_steps"] for _ in range(16)]
    assert made == [1.0] * 16
    assert schedule_of(t.args, 64, "train") == sum(made)


# ---- the training reward ------------------------------------------------------------------------------


def test_unpruned_dppo_reward_ht_equals_grpos_reward_mean(tmp_path):
    """The same 6 prompts and rollouts (the stand-in engine is deterministic per prompt) through both
    arms, DPPO without prompt pruning: the HT reward is GRPO's reward mean, the same float."""
    grpo = one_step(controller(tmp_path / "grpo", DPPOConfig(method="grpo")))[0]
    dppo, samples = one_step(controller(tmp_path / "dppo", DPPOConfig(completion_prune_rate=0.5, p_min=0.2)))
    raw = torch.cat([s.rewards for s in samples]).double()
    assert grpo["rollout/reward_ht"] == grpo["rollout/reward_mean"] == dppo["rollout/reward_ht"]
    assert grpo["rollout/equal_reward_frac_ht"] == grpo["rollout/equal_reward_frac"]
    assert dppo["rollout/equal_reward_frac_ht"] == grpo["rollout/equal_reward_frac"]
    assert dppo["rollout/reward_mean"] == dppo["rollout/reward_ht"]
    assert grpo["rollout/reward_mean"] == pytest.approx(float(raw.mean()), rel=1e-14)


def test_reward_ht_reweights_the_rolled_out_prompts_to_the_drawn_batch(tmp_path):
    cfg = DPPOConfig(prompt_rate_control="fixed", prompt_prune_rate=0.5, q_min=0.2, seed=3)
    t = controller(tmp_path, cfg, batch=8, n_prompts=8)
    one_step(t)  # epoch 1: every prompt unseen, drawn at one score
    status, samples = one_step(t)  # epoch 2: scores from the history, q < 1 for some
    G = t.args.rollout.n_samples_per_prompt
    q = torch.tensor([samples.ctx.prompts[s.prompts[0]].q for s in samples[::G]], dtype=torch.float64)
    assert (q < 1).any() and status["prompts/drawn"] == 8
    sums = torch.cat([s.rewards for s in samples]).double().reshape(-1, G).sum(1)
    assert status["rollout/reward_ht"] == pytest.approx(float((sums / q).sum() / (8 * G)), rel=1e-14)
    assert status["rollout/reward_ht"] != status["rollout/reward_mean"]
    equal = torch.tensor([len({float(r) for s in samples[j : j + G] for r in s.rewards}) == 1
                          for j in range(0, len(samples), G)], dtype=torch.float64)  # fmt: skip
    assert status["rollout/equal_reward_frac"] == pytest.approx(float(equal.mean()), rel=1e-14)
    assert status["rollout/equal_reward_frac_ht"] == pytest.approx(float((equal / q).sum() / 8), rel=1e-14)


def test_zero_share_control_prunes_each_draw_at_the_all_equal_share_of_the_steps_before(tmp_path):
    cfg = DPPOConfig(prompt_rate_control="zero-share", prompt_prune_rate=0.25, q_min=0.1, seed=3)
    t = controller(tmp_path, cfg, batch=8, n_prompts=16)
    first, _ = one_step(t)
    assert first["dppo/prompt_prune_rate_target"] == 0.25  # nothing measured yet: --dppo.prompt_prune_rate
    u1 = first["rollout/equal_reward_frac_ht"]
    assert 0.0 < u1 < 0.7  # the stand-in reward solves some groups entirely, not all: a real rate
    second, samples = one_step(t)
    assert second["dppo/prompt_prune_rate_target"] == u1  # the rate the trainer fed it, taken as it is
    # the draw used that rate: its q sum to (1 - u1) x the 8 prompts drawn (unseen prompts are scored
    # like the seen ones, so every q is free to move), rounded to a whole
    # kept count by the systematic design; the first rate would keep 6
    kept = round(8 * (1.0 - u1))
    assert kept != 6 and second["prompts/rolled_out"] == kept and second["prompts/drawn"] == 8
    assert second["dppo/prompt_keep_frac_expected"] == pytest.approx(kept / 8, rel=1e-12)
    G = t.args.rollout.n_samples_per_prompt
    q = [samples.ctx.prompts[s.prompts[0]].q for s in samples[::G]]
    assert len(q) == second["prompts/rolled_out"] and min(q) < 1.0
    u2 = second["rollout/equal_reward_frac_ht"]
    assert t.samples_generator.rate_control.rate() == pytest.approx(0.8 * u1 + 0.2 * u2, rel=1e-12)


@pytest.mark.parametrize("method", ["dppo", "grpo"])
def test_reward_statistics_are_of_the_raw_rewards_not_the_length_penalised_ones(tmp_path, method):
    # the DAPO overlong penalty hits every response longer than 24 - 20 = 4 tokens
    penalty = ["--reward.overlong_buffer_len", "20", "--reward.overlong_penalty_factor", "1.0"]
    t = controller(tmp_path, DPPOConfig(method=method), extra=penalty)
    status, samples = one_step(t)
    raw = torch.tensor([float(s.info["score"]) for s in samples], dtype=torch.float64)  # as vLLM returned it
    assert any(int(s.response_length) > 4 for s in samples)
    assert status["rollout/reward_mean"] == pytest.approx(float(raw.mean()), rel=1e-14)
    assert status["rollout/reward_std"] == pytest.approx(float(raw.std()), rel=1e-12)
    assert status["rollout/reward_ht"] == status["rollout/reward_mean"]
