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
from openrlhf_dppo.adapters.trainer import DPPO_STATE, AccountingError, DPPOTrainer, check_accounting
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


def test_a_resumed_run_reports_the_restored_step_from_its_first_status_never_step_0(tmp_path, monkeypatch):
    args = make_args(base_argv() + ["--ckpt.path", str(tmp_path / "ckpt"), "--ckpt.load_enable"])
    os.makedirs(tmp_path / "ckpt" / "_actor")
    states = {"episode": 0, "global_step": 6, "total_consumed_prompts": 24, "data_loader_state_dict": {}}
    run = RunDir(str(tmp_path / "run"), max_steps=9)
    t = bare_trainer(args, DPPOConfig(), run, CheckpointGroup(states))
    written = []  # every status.json the trainer writes, in order
    status = run.status
    monkeypatch.setattr(
        run,
        "status",
        lambda state, step, *a, **k: (written.append((state, step)), status(state, step, *a, **k))[1],
    )

    def host_fit(self, global_step=0):  # OpenRLHF's fit: load the checkpoint states first, then train
        self.init_checkpoint_states()
        raise RuntimeError("killed")

    monkeypatch.setattr(Trainer.__mro__[1], "fit", host_fit)  # the host class _DPPOTrainer extends
    with pytest.raises(RuntimeError):
        t.fit(0)  # the driver calls fit(0) on a restart too
    # running at the restored step from the first write on, then failed at it (not at 0)
    assert written == [("running", 6), ("failed", 6)]
    saved = json.load(open(tmp_path / "run" / "status.json"))
    assert (saved["state"], saved["step"], saved["max_steps"]) == ("failed", 6, 9)


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
