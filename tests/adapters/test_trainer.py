"""The trainer actor's seams without Ray: checkpoint hooks carry the prompt history, the run directory
gets one metrics line per step, and one controller step (samples generator -> experience maker ->
dispatch plan -> per-rank replay buffers) accounts for every generated token with counts that can
disagree. (The run's length, evaluation points and training reward: test_trainer_run.py.)"""

import json
import math
import os

import numpy as np
import pytest
import torch
from dppo_pipeline import CheckpointGroup, bare_trainer, controller, one_step
from dppo_stand_ins import base_argv, make_args
from openrlhf.trainer import ppo_trainer

from openrlhf_dppo.adapters import trainer as trainer_module
from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker
from openrlhf_dppo.adapters.step import DPPO_STATE, AccountingError
from openrlhf_dppo.core import DPPOConfig
from openrlhf_dppo.run_dir import RunDir

pytestmark = pytest.mark.usefixtures("stand_in_ray")
NO_PROMPT_PRUNING = dict(prompt_rate_control="fixed", prompt_prune_rate=0.0)


def test_history_round_trips_through_the_checkpoint_hooks_and_metrics_are_written(tmp_path):
    args = make_args(base_argv() + ["--ckpt.save_steps", "3", "--ckpt.path", str(tmp_path / "ckpt")])
    cfg = DPPOConfig(prompt_prune_rate=0.5, prompt_rate_control="zero-share")
    group = CheckpointGroup()
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "run"), max_steps=9), group)
    t.samples_generator.rate_control.observe(0.375)  # the zero-share control's measured share
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
    assert resumed.samples_generator.rate_control.rate() == 0.375  # not the first rate, 0.5, again
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
    t.samples_generator.generate_samples = lambda **kwargs: ([], 0.0, 0, True)
    t.eval_dataloader = None
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

    monkeypatch.setattr(
        trainer_module._PPOTrainerBase, "fit", host_fit
    )  # the host class _DPPOTrainer extends
    with pytest.raises(RuntimeError):
        t.fit(0)  # the driver calls fit(0) on a restart too
    # running at the restored step from the first write on, then failed at it (not at 0)
    assert written == [("running", 6), ("failed", 6)]
    saved = json.load(open(tmp_path / "run" / "status.json"))
    assert (saved["state"], saved["step"], saved["max_steps"]) == ("failed", 6, 9)
    assert saved["reason"] == "RuntimeError: killed"


def test_a_run_whose_prompts_run_out_before_max_steps_says_so(tmp_path, monkeypatch):
    args = make_args(base_argv() + ["--dppo.max_steps", "9"])
    run = RunDir(str(tmp_path / "run"), max_steps=9)
    t = bare_trainer(args, DPPOConfig(), run, CheckpointGroup({}))
    t.step_limit = 9  # what __init__ reads from --dppo.max_steps
    t.samples_generator.generate_samples = lambda **kwargs: ([], 0.0, 0, True)
    t.eval_dataloader = None
    monkeypatch.setattr(t, "init_checkpoint_states", lambda: {"global_step": 0})

    def host_fit(self, global_step=0):  # OpenRLHF's fit: the dataloader ends after 4 steps
        self._last_step = 4

    monkeypatch.setattr(trainer_module._PPOTrainerBase, "fit", host_fit)
    warned = []
    monkeypatch.setattr(trainer_module.logger, "warning", warned.append)
    t.fit(0)
    saved = json.load(open(tmp_path / "run" / "status.json"))
    assert (saved["state"], saved["step"], saved["max_steps"]) == ("finished", 4, 9)
    assert "ran out after 4 of --dppo.max_steps 9" in saved["reason"]
    assert warned == [saved["reason"]] and "--train.num_episodes" in warned[0]


# ---- one controller step: samples generator -> experience maker -> dispatch -> per-rank buffers ------


def test_one_controller_step_accounts_for_every_generated_token(tmp_path):
    cfg = DPPOConfig(prompt_prune_rate=0.25, completion_prune_rate=0.5, p_min=0.2, seed=4)
    t = controller(tmp_path, cfg, dp=2)
    one_step(t)
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
    assert "make_experience_batch" not in vars(t.experience_maker)


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
    # one prompt x 4 a step: a train batch of 4 makes it one optimizer step (8 would make none)
    t = controller(tmp_path, cfg, extra=("--train.batch_size", "4"), dp=2, batch=1, n_prompts=40)
    fillers = 0.0
    for _ in range(12):
        status, _ = one_step(t)
        assert status["samples/generated"] == status["samples/trained"] + status["samples/pruned"]
        assert status["samples/fillers"] >= status["dppo/completion_fillers"]
        fillers += status["samples/fillers"]
    assert fillers > 0  # the case happened


def test_grpo_mode_step_uses_the_host_path_and_reports_nothing_pruned(tmp_path):
    t = controller(tmp_path, DPPOConfig(method="grpo"), batch=4)
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


@pytest.mark.parametrize("method", ["dppo", "grpo"])
def test_dynamic_filtering_counts_the_dropped_groups_and_the_history_sees_them(tmp_path, method):
    # no prompt pruning, so that the all-solved prompts are drawn and the filter drops them
    cfg = DPPOConfig(**NO_PROMPT_PRUNING, completion_prune_rate=0.5, p_min=0.2, seed=1, method=method)
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
    if method == "dppo":
        index = torch.tensor([int(p.split()[-1]) for p in dropped])
        assert t.history.count[index].tolist() == [1] * len(dropped)
        assert torch.isfinite(t.history.score(index, G)).all()  # no longer "unseen"


def test_with_dynamic_filtering_dppo_takes_openrlhfs_step_count_from_the_accepted_groups(tmp_path):
    """22 prompts, B = 6, G = 4, train batch 8, nothing pruned; every 4th prompt is all-solved and
    filtered. Steps 1 and 2 draw 8 prompts each (2 filtered, 2 replacements): 6 groups accepted. Step 3
    draws the last 6, 2 are filtered and nothing is left to replace them: 4 groups, 16 rollouts.
    OpenRLHF's replay buffer makes min(6 x 4 // 8, 16 // 8) = 2 optimizer steps of them; so must DPPO's
    plan (the 6 drawn would make 3)."""
    cfg = DPPOConfig(**NO_PROMPT_PRUNING)
    t = controller(tmp_path, cfg, extra=["--algo.dynamic_filtering_enable"], batch=6, n_prompts=22)
    G, B, T = 4, 6, 8
    made, accepted, drawn = [], [], []
    for _ in range(3):
        status, samples = one_step(t)
        made.append(status["dppo/optimizer_steps"])
        accepted.append(len(samples) // G)
        drawn.append(status["prompts/drawn"])
        assert status["samples/pruned"] == 0  # no pruning: only the filter removed groups
    assert (drawn, accepted) == ([8, 8, 6], [6, 6, 4])
    host = [min(B * G // T, n * G // T) for n in accepted]  # NaiveReplayBuffer.setup_dynamic_batch, one rank
    assert made == host == [3, 3, 2]


@pytest.mark.parametrize("rule", ["drop", "train"])
@pytest.mark.parametrize("method", ["dppo", "grpo"])
def test_a_short_last_batch_of_fewer_rollouts_than_ranks_is_counted_untrained_in_both_arms(
    tmp_path, monkeypatch, method, rule
):
    """5 prompts in batches of 2, 2, 1 x G = 4 on 8 data-parallel ranks (train batch 8): the last batch
    holds 4 rollouts, fewer than the ranks. OpenRLHF's forwards need one rollout per rank (its run stops
    there). Under drop it is smaller than a train batch; under train it cannot be spread over the ranks:
    in both arms it is not trained and counted as untrained (generated = trained + pruned + untrained)."""
    cfg = DPPOConfig(**NO_PROMPT_PRUNING, method=method, short_batch=rule)
    half_right = lambda prompt, i: float(i % 2)  # noqa: E731  every group mixed: nothing pruned
    t = controller(
        tmp_path, cfg, dp=8, batch=2, n_prompts=5, extra=["--dppo.short_batch", rule], reward=half_right
    )
    warned = []
    monkeypatch.setattr(trainer_module.logger, "warning", warned.append)
    for _ in range(2):  # full batches: 8 rollouts, one train batch, trained
        status, samples = one_step(t)
        assert status["samples/trained"] == len(samples) == 8 and status["samples/untrained"] == 0
    appended = 0 if method == "dppo" else len(t.actor_model_group.appended)
    status, samples = one_step(t)  # the short last batch
    tokens = float(sum(int(s.action_mask.sum()) for s in samples))
    assert len(samples) == 4 and status["samples/generated"] == 4.0
    assert status["samples/trained"] == status["tokens/trained"] == 0.0
    assert status["samples/untrained"] == 4.0 and status["tokens/untrained"] == tokens
    assert status["samples/pruned"] == status["samples/fillers"] == 0.0  # no micro-batch ran
    if method == "dppo":  # forwarded with zero-weight copies of its shortest rollout; the plan makes no step
        assert status["dppo/optimizer_steps"] == 0.0 and status["dppo/completion_fillers"] == 4.0
    else:  # sent to no rank, and the step says why
        assert len(t.actor_model_group.appended) == appended
        assert any("fewer than the 8 data-parallel ranks" in w for w in warned)


def test_a_greso_step_trains_grpos_way_counts_the_skipped_prompts_and_checkpoints_its_state(tmp_path):
    """--dppo.method greso: OpenRLHF's experience maker and step (nothing pruned after the rollout, no
    dppo/* keys), the skipped prompts counted as prompts/pruned (drawn = rolled out + pruned), the greso/*
    keys logged, and the streaks, p_easy / p_hard and the draw counter carried by the checkpoint."""
    cfg = DPPOConfig(method="greso", seed=3)
    extra = [
        "--algo.dynamic_filtering_enable",
        "--ckpt.save_steps",
        "5",
        "--ckpt.path",
        str(tmp_path / "ckpt"),
    ]
    t = controller(tmp_path, cfg, extra=extra, batch=4, n_prompts=16)
    statuses = [one_step(t)[0] for _ in range(5)]  # 3 steps over the 16 prompts, then 2 of the second pass
    for s in statuses:
        assert s["prompts/drawn"] == s["prompts/rolled_out"] + s["prompts/pruned"]
        assert (
            s["samples/generated"] == s["samples/trained"] + s["samples/filtered"]
            and s["samples/pruned"] == 0
        )
        assert not any(k.startswith("dppo/") for k in s)
        assert all(k in s for k in ("greso/p_easy", "greso/p_hard", "greso/easy_share", "greso/hard_share"))
    assert [s["greso/adapted"] for s in statuses] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert sum(s["prompts/pruned"] for s in statuses) > 0  # seed 3 skips some all-solved prompts

    t.actor_model_group = group = CheckpointGroup()
    client_states = {
        "episode": 1,
        "global_step": 5,
        "total_consumed_prompts": 30,
        "data_loader_state_dict": {},
    }
    t.save_logs_and_checkpoints(5, {"policy_loss": 0.0}, client_states)
    path = tmp_path / "client_state.pt"
    torch.save(group.saved[0]["client_states"], path)  # DeepSpeed's client_state: plain tensors and values
    states = torch.load(path, weights_only=True)
    assert (
        states[DPPO_STATE]["method"] == "greso" and states[DPPO_STATE]["draws"] == t.samples_generator.draws
    )

    os.makedirs(tmp_path / "ckpt" / "_actor")
    resumed = controller(
        tmp_path / "resumed", cfg, extra=extra + ["--ckpt.load_enable"], batch=4, n_prompts=16
    )
    resumed.actor_model_group = CheckpointGroup(states)
    assert resumed.init_checkpoint_states()["global_step"] == 5
    gen, again = t.samples_generator, resumed.samples_generator
    assert again.draws == gen.draws and again.greso_control.state_dict() == gen.greso_control.state_dict()
    assert torch.equal(again.streaks.z_easy, gen.streaks.z_easy) and torch.equal(
        again.streaks.z_hard, gen.streaks.z_hard
    )
