"""The trainer actor's seams without Ray: checkpoint hooks carry the prompt history, the run directory
gets one metrics line per step, one controller step (samples generator -> experience maker -> dispatch
plan -> per-rank replay buffers) accounts for every generated token with counts that can disagree, the
run's length (--dppo.max_steps) and evaluation points, and the training reward (raw, HT)."""

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from dppo_stand_ins import (
    GENERATE_KW,
    StandInGroup,
    StandInTokenizer,
    base_argv,
    generator_for,
    logprob_fn,
    make_args,
    solved_every_4th,
)
from openrlhf.trainer import ppo_trainer
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from openrlhf_dppo.adapters._ray import unwrap_actor_class
from openrlhf_dppo.adapters.actor import DPPOReplayBuffer, micro_batch_counts, step_counts
from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker
from openrlhf_dppo.adapters.run_dir import RunDir
from openrlhf_dppo.adapters.step import PROMPT_ATTR
from openrlhf_dppo.adapters.trainer import (
    DPPO_STATE,
    AccountingError,
    DPPOTrainer,
    check_accounting,
    scheduler_steps,
)
from openrlhf_dppo.core import DPPOConfig, PromptHistory

Trainer = unwrap_actor_class(DPPOTrainer)


pytestmark = pytest.mark.usefixtures("stand_in_ray")


class CheckpointGroup:
    """Actor group stand-in that keeps what ``save_checkpoint`` is given, as DeepSpeed would."""

    def __init__(self, states=None):
        self.saved = []
        self.states = states

    def async_run_method(self, method_name, **kwargs):
        if method_name == "save_checkpoint":
            self.saved.append(kwargs)
        if method_name == "get_checkpoint_states":
            return [self.states]
        return [None]


def bare_trainer(args, cfg, run_dir, group):
    """A trainer object with the attributes BasePPOTrainer's hooks use (its __init__ needs Ray and a model)."""
    t = object.__new__(Trainer)
    t.args, t.strategy, t.dppo = args, SimpleNamespace(args=args), cfg
    t.history = PromptHistory(10, decay=cfg.history_decay, prior=cfg.history_prior)
    t.samples_generator = SimpleNamespace(draws=0)
    t.run_dir = run_dir
    t.actor_model_group, t.critic_model_group = group, None
    t.wandb_logger = t.tensorboard_logger = None
    t.best_eval_metric_key, t.best_eval_metric_value, t._latest_eval_metric_value = "", float("-inf"), None
    t._last_step = 0
    t._checkpoint_states = None
    t._ctx = None
    t.step_limit = None
    return t


def test_history_round_trips_through_the_checkpoint_hooks_and_metrics_are_written(tmp_path):
    args = make_args(base_argv() + ["--ckpt.save_steps", "3", "--ckpt.path", str(tmp_path / "ckpt")])
    cfg = DPPOConfig(prompt_prune_rate=0.5)
    group = CheckpointGroup()
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "run"), max_steps=9), group)
    t.history.update(
        torch.tensor([1, 4, 4, 7]), torch.tensor([[1.0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0], [1] * 4]), 2
    )
    t.samples_generator.draws = 5
    logs = {
        "policy_loss": 0.25,
        "timing/step_total": 2.0,
        "tokens/generated": 300.0,
        "generated_samples": ["x", 1],
    }
    client_states = {
        "episode": 0,
        "global_step": 3,
        "total_consumed_prompts": 12,
        "data_loader_state_dict": {},
    }
    t.save_logs_and_checkpoints(3, logs, client_states)

    (saved,) = group.saved
    assert saved["tag"] == "global_step3"
    # DeepSpeed writes client_state with torch.save; it must load back as plain tensors and values
    path = tmp_path / "client_state.pt"
    torch.save(saved["client_states"], path)
    states = torch.load(path, weights_only=True)
    assert states["global_step"] == 3 and states[DPPO_STATE]["draws"] == 5

    os.makedirs(tmp_path / "ckpt" / "_actor")
    args.ckpt.load_enable = True
    resumed = bare_trainer(args, cfg, RunDir(str(tmp_path / "run2")), CheckpointGroup(states))
    assert resumed.init_checkpoint_states()["global_step"] == 3
    assert resumed.samples_generator.draws == 5
    for field in ("count", "last_step", "succ", "n", "var"):
        np.testing.assert_array_equal(getattr(resumed.history, field), getattr(t.history, field))
    idx = torch.arange(10)
    assert torch.equal(resumed.history.score(idx, 4), t.history.score(idx, 4))

    (line,) = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert line["kind"] == "train" and line["step"] == 3 and line["policy_loss"] == 0.25
    assert line["perf/tokens_per_sec"] == 150.0 and "generated_samples" not in line
    status = json.load(open(tmp_path / "run" / "status.json"))
    assert status["state"] == "running" and status["step"] == 3 and status["max_steps"] == 9


def test_accounting_check_raises_on_a_mismatch_or_a_missing_count():
    ok = {"tokens/generated": 10.0, "tokens/trained": 5.0, "tokens/pruned": 3.0, "tokens/filtered": 2.0}
    ok.update(
        {"samples/generated": 4.0, "samples/trained": 2.0, "samples/pruned": 1.0, "samples/filtered": 1.0}
    )
    check_accounting(ok)
    with pytest.raises(AccountingError, match=r"tokens: generated 10.0 != trained 5.0 \+ pruned 2.0"):
        check_accounting({**ok, "tokens/pruned": 2.0})
    with pytest.raises(AccountingError, match="samples: no count of trained"):
        check_accounting({k: v for k, v in ok.items() if k != "samples/trained"})


# ---- one controller step: samples generator -> experience maker -> dispatch -> per-rank buffers ------


class AppendGroup:
    """Actor group stand-in: one real DPPOReplayBuffer per rank; fit() runs the planned micro-batches
    and counts them as DPPOActorTrainer does (``micro_batch_counts`` per micro-batch, ``step_counts``)."""

    def __init__(self, dp, args):
        self.buffers = [DPPOReplayBuffer(1, 0, True, True, True) for _ in range(dp)]
        self.args = args
        self.forward = StandInGroup(logprob_fn(0.01, 0.05, 5), dp)

    def async_run_method_batch(self, method_name, **kwargs):
        if method_name == "forward":
            return self.forward.async_run_method_batch(method_name, **kwargs)
        assert method_name == "append"
        (experiences,) = kwargs.values()
        assert len(experiences) == len(self.buffers)  # one batched Experience per rank
        for buffer, exp in zip(self.buffers, experiences):
            buffer.append(exp)
        return []

    def async_run_method(self, method_name, **kwargs):
        if method_name != "fit":
            return [None]
        per_rank, counts = [], torch.zeros(4, dtype=torch.float64)
        for buffer in self.buffers:
            buffer.setup_dynamic_batch(SimpleNamespace(args=self.args))
            per_rank.append(len(buffer))
            for m in range(len(buffer)):
                counts += micro_batch_counts(buffer.collate_fn([buffer[m]]))
            buffer.clear()
        assert len(set(per_rank)) == 1
        return [{"policy_loss": 0.0, "micro_batches": float(per_rank[0]), **step_counts(counts, 1, None)}]


class HostAppendGroup:
    """Actor group stand-in for the GRPO path: keeps what is appended, returns a fixed fit status."""

    def __init__(self):
        self.appended = []
        self.forward = StandInGroup(logprob_fn(0.01, 0.05, 5), 1)

    def async_run_method_batch(self, method_name, **kwargs):
        if method_name == "forward":
            return self.forward.async_run_method_batch(method_name, **kwargs)
        self.appended.extend(kwargs["experience"])
        return []

    def async_run_method(self, method_name, **kwargs):
        return [{"policy_loss": 0.5}] if method_name == "fit" else [None]


def controller(tmp_path, cfg, extra=(), dp=1, batch=6, n_prompts=24, reward=solved_every_4th):
    """A trainer with the real samples generator (stand-in engine), experience maker and, for DPPO, the
    per-rank DPPO replay buffers: a controller step without Ray."""
    args = make_args(base_argv(dp=dp, batch=batch, train_batch=8) + list(extra))
    group = AppendGroup(dp, args) if cfg.enable else HostAppendGroup()
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "run")), group)
    t.history = PromptHistory(n_prompts) if cfg.enable else None
    t.tokenizer, t.kl_ctl, t.vllm_engines = StandInTokenizer(), FixedKLController(0.0), None
    t.samples_generator, t.engine = generator_for(args, cfg, t.history, n_prompts, reward)
    if cfg.enable:
        t.experience_maker = DPPOExperienceMaker(group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer,
                                                 dppo=cfg, history=t.history)  # fmt: skip
    else:
        t.experience_maker = RemoteExperienceMaker(
            group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer
        )
    return t


def one_step(t):
    """What OpenRLHF's loop does for one step: ask for the rollouts, train them. (status, rollouts)."""
    for _ in range(3):  # an exhausted answer ends an epoch; OpenRLHF's loop then asks again
        samples = t._next_rollouts(t.samples_generator.generate_samples, **GENERATE_KW)[0]
        if samples:
            break
    assert samples, "the stand-in draw gave nothing to train"
    status, t._last_step = t.train_step(samples, t._last_step)
    return status, samples


def test_one_controller_step_accounts_for_every_generated_token(tmp_path):
    cfg = DPPOConfig(prompt_prune_rate=0.25, completion_prune_rate=0.5, p_min=0.2, seed=4)
    t = controller(tmp_path, cfg, dp=2)
    one_step(t)  # every prompt unseen: all 6 kept
    status, samples = one_step(t)  # 6 new prompts: the history still knows none of them
    G = t.args.rollout.n_samples_per_prompt
    tokens = sum(int(s.action_mask.sum()) for s in samples)
    assert status["samples/generated"] == len(samples) and status["tokens/generated"] == tokens
    assert status["tokens/generated"] == status["tokens/trained"] + status["tokens/pruned"]
    assert 0 < status["samples/trained"] < status["samples/generated"]
    assert status["samples/filtered"] == status["tokens/filtered"] == 0
    assert status["micro_batches"] == status["dppo/pack_micro_batches"]
    assert status["rollout/num_samples"] == len(samples)  # rollout stats over all rollouts
    assert status["dppo/normalizer_seqs"] == status["prompts/drawn"] * G
    assert math.isclose(status["dppo/completion_keep_frac"], status["samples/trained"] / len(samples))
    assert ppo_trainer.balance_experiences.__name__ == "balance_experiences"  # the swap was undone
    assert "make_experience_batch" not in vars(t.experience_maker) and t._ctx is None


def test_a_broken_count_stops_the_step(tmp_path, monkeypatch):
    """A kept completion that reaches the actors with weight 0 (here: the top-up picks a kept one) is
    not trained: the actors' count falls short of generated - pruned and the step stops."""
    cfg = DPPOConfig(completion_prune_rate=0.5, p_min=0.2, seed=4)
    t = controller(tmp_path, cfg)
    monkeypatch.setattr(
        DPPOExperienceMaker, "_top_up", staticmethod(lambda mask, lengths, dp: [int(mask.nonzero()[0])])
    )
    with pytest.raises(AccountingError, match=r"tokens: generated \d+.0 != trained \d+.0 \+ pruned"):
        one_step(t)


def test_fillers_are_counted_on_their_own_and_not_as_trained(tmp_path):
    # 2 ranks and a keep rate that leaves fewer kept completions than ranks now and then: top-ups
    cfg = DPPOConfig(completion_prune_rate=0.9, p_min=0.05, seed=0)
    t = controller(tmp_path, cfg, dp=2, batch=1, n_prompts=40)
    fillers = 0.0
    for _ in range(12):
        status, _ = one_step(t)
        assert status["samples/generated"] == status["samples/trained"] + status["samples/pruned"]
        assert status["samples/fillers"] >= status["dppo/completion_fillers"]
        fillers += status["samples/fillers"]
    assert fillers > 0  # the case happened


def test_grpo_mode_step_uses_the_host_path_and_reports_nothing_pruned(tmp_path):
    t = controller(tmp_path, DPPOConfig(enable=False), batch=4)
    status, samples = one_step(t)
    tokens = float(sum(int(s.action_mask.sum()) for s in samples))
    assert status["tokens/generated"] == status["tokens/trained"] == tokens and status["tokens/pruned"] == 0.0
    assert (
        status["samples/trained"] == 16.0 and status["prompts/drawn"] == status["prompts/rolled_out"] == 4.0
    )
    assert not any(k.startswith("dppo/") for k in status)
    assert (
        sum(len(e.sequences) for e in t.actor_model_group.appended) == 16
    )  # every rollout reached the actor


@pytest.mark.parametrize("enable", [True, False])
def test_dynamic_filtering_counts_the_dropped_groups_and_the_history_sees_them(tmp_path, enable):
    cfg = DPPOConfig(prompt_prune_rate=0.25, completion_prune_rate=0.5, p_min=0.2, seed=1, enable=enable)
    t = controller(tmp_path, cfg, extra=["--algo.dynamic_filtering_enable"], batch=4)
    status, samples = one_step(t)
    G = t.args.rollout.n_samples_per_prompt
    dropped = [p for p in t.engine.prompts if int(p.split()[-1]) % 4 == 0]  # all-solved: filtered out
    assert dropped and status["samples/filtered"] == G * len(dropped)
    assert (
        status["samples/generated"] == len(samples) + status["samples/filtered"] == G * len(t.engine.prompts)
    )
    assert (
        status["samples/generated"]
        == status["samples/trained"] + status["samples/pruned"] + status["samples/filtered"]
    )
    assert status["rollout/num_samples"] == status["samples/generated"]  # the dropped groups are rollouts
    if enable:
        index = torch.tensor([int(p.split()[-1]) for p in dropped])
        assert t.history.count[index].tolist() == [1] * len(dropped)
        assert torch.isfinite(t.history.score(index, G)).all()  # no longer "unseen"


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


class EndlessGenerator:
    """Samples-generator stand-in that never runs out of prompts: OpenRLHF's loop alone would not stop."""

    def __init__(self, evals):
        self.calls = 0
        self.steps = []  # the step of each context handed in
        self.draws = 0
        self.evals = evals

    def generate_samples(self, ctx, **kwargs):
        self.steps.append(ctx.step)
        self.calls += 1
        if self.calls > 40:
            raise RuntimeError("the training loop did not stop")
        return ["a rollout"], None, 1, False

    def generate_eval_samples(self, **kwargs):
        return self.evals


class StandInLoader(list):
    def state_dict(self):
        return {}


def looping_trainer(tmp_path, enable, extra=(), states=None):
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
    group = CheckpointGroup(states)
    t = bare_trainer(args, DPPOConfig(enable=enable), RunDir(str(tmp_path / "run")), group)
    evals = [Experience(prompts=["p"], rewards=r, response_length=torch.tensor([3]), truncated=torch.tensor([0]))
             for r in (1.0, 0.0, 0.0, 1.0)]  # fmt: skip
    t.samples_generator = EndlessGenerator(evals)
    t.eval_dataloader = [(["math"], ["p"], [""], [None])]
    t.prompts_dataloader = StandInLoader(range(8))
    t.generate_kwargs = {"temperature": 1.0}
    t.broadcast_to_vllm = lambda: None

    def train_step(samples, step):
        t._ctx = None  # the step's context is used up
        return {"timing/make_experience": 0.01}, step + 1

    t.train_step = train_step
    return t


def lines(tmp_path, kind):
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    return [r for r in rows if r["kind"] == kind]


@pytest.mark.parametrize("enable", [True, False])
def test_max_steps_ends_the_run_after_the_last_steps_evaluation(tmp_path, enable):
    t = looping_trainer(tmp_path, enable)
    t.step_limit = 5
    t.fit()
    assert [r["step"] for r in lines(tmp_path, "train")] == [1, 2, 3, 4, 5]
    assert t.samples_generator.steps == [1, 2, 3, 4, 5]  # the exhausted answers generate nothing
    evals = lines(tmp_path, "eval")
    assert [r["step"] for r in evals] == [0, 2, 4]  # a fresh run starts with an evaluation at step 0
    assert all(r["timing/eval"] >= 0 and r["eval_math_pass1"] == 0.5 for r in evals)
    status = json.load(open(tmp_path / "run" / "status.json"))
    assert status["state"] == "finished" and status["step"] == 5
    assert "generate_samples" not in vars(t.samples_generator)  # fit's routing was undone


def test_the_last_step_is_evaluated_when_it_is_on_the_schedule_and_a_resume_skips_step_0(tmp_path):
    os.makedirs(tmp_path / "ckpt" / "_actor")
    states = {"episode": 0, "global_step": 2, "total_consumed_prompts": 8, "data_loader_state_dict": {}}
    t = looping_trainer(tmp_path, True, ["--ckpt.load_enable"], states=states)
    t.step_limit = 4
    t.fit()
    assert [r["step"] for r in lines(tmp_path, "train")] == [3, 4] == t.samples_generator.steps
    assert [r["step"] for r in lines(tmp_path, "eval")] == [4]


def test_the_lr_schedule_spans_the_steps_max_steps_allows():
    args = make_args(base_argv(batch=4, group=4, train_batch=8) + ["--train.max_epochs", "2"])
    assert scheduler_steps(args, 1000, None) == 1000
    assert scheduler_steps(args, 1000, 7) == 7 * (4 * 4 // 8) * 2
    assert scheduler_steps(args, 10, 7) == 10


# ---- the training reward ------------------------------------------------------------------------------


def test_unpruned_dppo_reward_ht_equals_grpos_reward_mean(tmp_path):
    """The same 6 prompts and rollouts (the stand-in engine is deterministic per prompt) through both
    arms, DPPO without prompt pruning: the HT reward is GRPO's reward mean, the same float."""
    grpo = one_step(controller(tmp_path / "grpo", DPPOConfig(enable=False)))[0]
    dppo, samples = one_step(controller(tmp_path / "dppo", DPPOConfig(completion_prune_rate=0.5, p_min=0.2)))
    raw = torch.cat([s.rewards for s in samples]).double()
    assert grpo["rollout/reward_ht"] == grpo["rollout/reward_mean"] == dppo["rollout/reward_ht"]
    assert dppo["rollout/reward_mean"] == dppo["rollout/reward_ht"]
    assert grpo["rollout/reward_mean"] == pytest.approx(float(raw.mean()), rel=1e-14)


def test_reward_ht_reweights_the_rolled_out_prompts_to_the_drawn_batch(tmp_path):
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.2, seed=3)
    t = controller(tmp_path, cfg, batch=8, n_prompts=8)
    one_step(t)  # epoch 1: all 8 prompts seen once (unseen prompts keep q = 1)
    status, samples = one_step(t)  # epoch 2: scores from the history, q < 1 for some
    G = t.args.rollout.n_samples_per_prompt
    q = torch.tensor([getattr(s, PROMPT_ATTR).q for s in samples[::G]], dtype=torch.float64)
    assert (q < 1).any() and status["prompts/drawn"] == 8
    sums = torch.cat([s.rewards for s in samples]).double().reshape(-1, G).sum(1)
    assert status["rollout/reward_ht"] == pytest.approx(float((sums / q).sum() / (8 * G)), rel=1e-14)
    assert status["rollout/reward_ht"] != status["rollout/reward_mean"]


@pytest.mark.parametrize("enable", [True, False])
def test_reward_statistics_are_of_the_raw_rewards_not_the_length_penalised_ones(tmp_path, enable):
    # the DAPO overlong penalty hits every response longer than 24 - 20 = 4 tokens
    penalty = ["--reward.overlong_buffer_len", "20", "--reward.overlong_penalty_factor", "1.0"]
    t = controller(tmp_path, DPPOConfig(enable=enable), extra=penalty)
    status, samples = one_step(t)
    raw = torch.tensor([float(s.info["score"]) for s in samples], dtype=torch.float64)  # as vLLM returned it
    assert any(int(s.response_length) > 4 for s in samples)
    assert status["rollout/reward_mean"] == pytest.approx(float(raw.mean()), rel=1e-14)
    assert status["rollout/reward_std"] == pytest.approx(float(raw.std()), rel=1e-12)
    assert status["rollout/reward_ht"] == status["rollout/reward_mean"]
