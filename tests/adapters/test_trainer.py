"""The trainer actor's seams without Ray: checkpoint hooks carry the prompt history, the run directory
gets one metrics line per step, and one controller step (samples generator -> experience maker ->
dispatch plan -> per-rank replay buffers) accounts for every generated token."""

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from dppo_stand_ins import (
    FAKE_RAY,
    StandInGroup,
    StandInTokenizer,
    base_argv,
    logprob_fn,
    make_args,
    rollout_batch,
)
from openrlhf.trainer import ppo_trainer
from openrlhf.trainer.ppo_utils import experience_maker as host_maker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from openrlhf_dppo.adapters._ray import unwrap_actor_class
from openrlhf_dppo.adapters.actor import DPPOReplayBuffer
from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker
from openrlhf_dppo.adapters.run_dir import RunDir
from openrlhf_dppo.adapters.samples_generator import PROMPT_ATTR, DrawRecord, PromptDraw
from openrlhf_dppo.adapters.trainer import (
    DPPO_STATE,
    AccountingError,
    DPPOTrainer,
    check_accounting,
    scheduler_steps,
)
from openrlhf_dppo.core import DPPOConfig, PromptHistory

Trainer = unwrap_actor_class(DPPOTrainer)


@pytest.fixture(autouse=True)
def stand_in_ray(monkeypatch):
    monkeypatch.setattr(ppo_trainer, "ray", FAKE_RAY)
    monkeypatch.setattr(host_maker, "ray", FAKE_RAY)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


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


def test_accounting_check_raises_on_a_mismatch():
    check_accounting({"tokens/generated": 10.0, "tokens/trained": 6.0, "tokens/pruned": 4.0})
    with pytest.raises(AccountingError, match="tokens"):
        check_accounting({"tokens/generated": 10.0, "tokens/trained": 6.0, "tokens/pruned": 3.0})


class AppendGroup:
    """Actor group stand-in: one real DPPOReplayBuffer per rank, fit() runs the planned micro-batches."""

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
        counts = []
        for buffer in self.buffers:
            buffer.setup_dynamic_batch(SimpleNamespace(args=self.args))
            counts.append(len(buffer))
            buffer.clear()
        assert len(set(counts)) == 1
        return [{"policy_loss": 0.0, "micro_batches": float(counts[0])}]


def test_one_controller_step_accounts_for_every_generated_token(tmp_path):
    args = make_args(base_argv(dp=2, batch=6, train_batch=8))
    G = args.rollout.n_samples_per_prompt
    cfg = DPPOConfig(completion_prune_rate=0.5, p_min=0.2)
    group = AppendGroup(2, args)
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "run")), group)
    t.tokenizer = StandInTokenizer()
    t.kl_ctl = FixedKLController(0.0)
    t.vllm_engines, t.reference_model_group = None, None
    t.experience_maker = DPPOExperienceMaker(group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer,
                                             dppo=cfg, history=t.history)  # fmt: skip
    samples = rollout_batch(6, G, seed=31)
    for i, s in enumerate(samples):
        setattr(s, PROMPT_ATTR, PromptDraw(i // G, 1.0))
    counts = {"prompts/drawn": 8.0, "prompts/rolled_out": 6.0, "prompts/pruned": 2.0}
    t.samples_generator = SimpleNamespace(
        last_draw=DrawRecord(drawn=8, kept=6, rolled_out=6), pop_counts=lambda: counts
    )

    status, step = t.train_step(samples, 0)
    tokens = sum(int(s.action_mask.sum()) for s in samples)
    assert step == 1
    assert status["tokens/generated"] == tokens == status["tokens/trained"] + status["tokens/pruned"]
    assert 0 < status["samples/trained"] < status["samples/generated"] == len(samples)
    assert status["micro_batches"] == status["dppo/pack_micro_batches"]
    assert status["rollout/num_samples"] == len(samples)  # rollout stats over all rollouts
    assert status["prompts/pruned"] == 2.0 and status["dppo/normalizer_seqs"] == 8 * G
    assert math.isclose(status["dppo/completion_keep_frac"], status["samples/trained"] / len(samples))
    assert ppo_trainer.balance_experiences.__name__ == "balance_experiences"  # the swap was undone


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


def test_grpo_mode_step_uses_the_host_path_and_reports_nothing_pruned(tmp_path):
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    args = make_args(base_argv() + ["--dppo.enable", "false"])
    group = HostAppendGroup()
    t = bare_trainer(args, DPPOConfig(enable=False), RunDir(str(tmp_path / "run")), group)
    t.tokenizer, t.kl_ctl, t.vllm_engines = StandInTokenizer(), FixedKLController(0.0), None
    t.experience_maker = RemoteExperienceMaker(
        group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer
    )
    samples = rollout_batch(4, 4, seed=41)
    status, _ = t.train_step(samples, 0)
    tokens = float(sum(int(s.action_mask.sum()) for s in samples))
    assert status["tokens/generated"] == status["tokens/trained"] == tokens and status["tokens/pruned"] == 0.0
    assert (
        status["samples/trained"] == 16.0 and status["prompts/drawn"] == status["prompts/rolled_out"] == 4.0
    )
    assert not any(k.startswith("dppo/") for k in status)
    assert sum(len(e.sequences) for e in group.appended) == 16  # every rollout reached the actor


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
        self.draws = 0
        self.evals = evals

    def generate_samples(self, **kwargs):
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
    t.train_step = lambda samples, step: ({"timing/make_experience": 0.01}, step + 1)
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
    assert t.samples_generator.calls == 5  # the exhausted answers do not generate anything
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
    assert [r["step"] for r in lines(tmp_path, "train")] == [3, 4]
    assert [r["step"] for r in lines(tmp_path, "eval")] == [4]


def test_the_lr_schedule_spans_the_steps_max_steps_allows():
    args = make_args(base_argv(batch=4, group=4, train_batch=8) + ["--train.max_epochs", "2"])
    assert scheduler_steps(args, 1000, None) == 1000
    assert scheduler_steps(args, 1000, 7) == 7 * (4 * 4 // 8) * 2
    assert scheduler_steps(args, 10, 7) == 10


# ---- the training reward ------------------------------------------------------------------------------


def dppo_step_status(tmp_path, args, samples, q=None, drawn=None):
    G = args.rollout.n_samples_per_prompt
    cfg = DPPOConfig()
    group = AppendGroup(1, args)
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "dppo")), group)
    t.tokenizer, t.kl_ctl, t.vllm_engines = StandInTokenizer(), FixedKLController(0.0), None
    t.experience_maker = DPPOExperienceMaker(group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer,
                                             dppo=cfg, history=t.history)  # fmt: skip
    n = len(samples) // G
    for i, s in enumerate(samples):
        setattr(s, PROMPT_ATTR, PromptDraw(i // G, 1.0 if q is None else q[i // G]))
    drawn = n if drawn is None else drawn
    counts = {
        "prompts/drawn": float(drawn),
        "prompts/rolled_out": float(n),
        "prompts/pruned": float(drawn - n),
    }
    t.samples_generator = SimpleNamespace(
        last_draw=DrawRecord(drawn=drawn, kept=n, rolled_out=n), pop_counts=lambda: counts
    )
    return t.train_step(samples, 0)[0]


def grpo_step_status(tmp_path, args, samples):
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    group = HostAppendGroup()
    t = bare_trainer(args, DPPOConfig(enable=False), RunDir(str(tmp_path / "grpo")), group)
    t.tokenizer, t.kl_ctl, t.vllm_engines = StandInTokenizer(), FixedKLController(0.0), None
    t.experience_maker = RemoteExperienceMaker(
        group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer
    )
    return t.train_step(samples, 0)[0]


def test_unpruned_dppo_reward_ht_equals_grpos_reward_mean(tmp_path):
    import copy

    args = make_args(base_argv(batch=6, train_batch=8))
    samples = rollout_batch(6, 4, seed=7, binary=False)
    grpo = grpo_step_status(tmp_path, copy.deepcopy(args), copy.deepcopy(samples))
    dppo = dppo_step_status(tmp_path, args, samples)
    raw = torch.cat([s.rewards for s in samples]).double()
    assert grpo["rollout/reward_ht"] == grpo["rollout/reward_mean"] == dppo["rollout/reward_ht"]
    assert dppo["rollout/reward_mean"] == dppo["rollout/reward_ht"]
    assert grpo["rollout/reward_mean"] == pytest.approx(float(raw.mean()), rel=1e-14)


def test_reward_ht_reweights_the_rolled_out_prompts_to_the_drawn_batch(tmp_path):
    args = make_args(base_argv(batch=8, train_batch=8))
    samples = rollout_batch(4, 4, seed=9)
    q = [0.5, 1.0, 0.25, 1.0]
    status = dppo_step_status(tmp_path, args, samples, q=q, drawn=8)
    sums = torch.cat([s.rewards for s in samples]).double().reshape(4, 4).sum(1)
    want = float(sum(sums[j] / q[j] for j in range(4)) / (8 * 4))
    assert status["rollout/reward_ht"] == pytest.approx(want, rel=1e-14)


@pytest.mark.parametrize("enable", [True, False])
def test_reward_statistics_are_of_the_raw_rewards_not_the_length_penalised_ones(tmp_path, enable):
    # the DAPO overlong penalty hits every response longer than 24 - 20 = 4 tokens
    penalty = ["--reward.overlong_buffer_len", "20", "--reward.overlong_penalty_factor", "1.0"]
    args = make_args(base_argv(batch=6, train_batch=8) + penalty)
    samples = rollout_batch(6, 4, seed=5)
    raw = torch.cat([s.rewards for s in samples]).double()
    status = (
        dppo_step_status(tmp_path, args, samples) if enable else grpo_step_status(tmp_path, args, samples)
    )
    assert status["rollout/reward_mean"] == pytest.approx(float(raw.mean()), rel=1e-14)
    assert status["rollout/reward_std"] == pytest.approx(float(raw.std()), rel=1e-12)
    assert status["rollout/reward_ht"] == status["rollout/reward_mean"]
