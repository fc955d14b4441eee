"""Actor side: OpenRLHF's real ActorPPOTrainer.training_step through DPPOActorTrainer weights the
KL-in-loss and entropy terms per sequence (METHOD.md condition 4); PolicyLoss is left alone."""

import copy
from types import SimpleNamespace

import pytest
import torch
from openrlhf.models import PolicyLoss
from openrlhf.models import loss as host_loss
from openrlhf.models.utils import compute_approx_kl
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ray import ppo_actor

from openrlhf_dppo.adapters.actor import DPPOActorTrainer, weighted_aux_losses
from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT
from openrlhf_dppo.core import fold_weights, weighted_aggregate


class StandInActor(torch.nn.Module):
    """A one-parameter 'model': log-probs and entropy move with theta (the real Actor needs a GPU model)."""

    def __init__(self, old, feature):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor(0.2))
        self.old, self.feature = old, feature

    def forward(
        self, sequences, action_mask, attention_mask=None, return_output=False, return_entropy=False, **_
    ):
        logp = (self.old + self.theta * self.feature) * action_mask
        entropy = 1.0 + self.theta * self.feature.abs()
        return logp, SimpleNamespace(entropy=entropy)  # (B, T - 1), as Actor returns it


def trainer_and_batch(cls):
    torch.manual_seed(0)
    B, T = 4, 9
    mask = torch.ones(B, T - 1)
    mask[:, :3] = 0  # prompt positions
    mask[1, 6:] = 0
    old = -torch.rand(B, T - 1) * mask
    ref = -torch.rand(B, T - 1) * mask
    weights = torch.tensor([2.0, 0.5, 4.0, 1.25])
    adv = torch.tensor([0.7, -1.1, 0.3, -0.2])[:, None].expand(B, T - 1)
    exp = Experience(
        sequences=torch.randint(3, 30, (B, T)), attention_mask=torch.ones(B, T, dtype=torch.long),
        action_mask=mask.bool(), action_log_probs=old, base_action_log_probs=ref,
        advantages=fold_weights(adv, weights), info={SAMPLE_WEIGHT: weights},
    )  # fmt: skip
    args = SimpleNamespace(
        algo=SimpleNamespace(
            kl=SimpleNamespace(use_loss=True, init_coef=0.05, estimator="k3", unbiased_gradient=False)
        ),
        actor=SimpleNamespace(entropy_coef=0.01),
        train=SimpleNamespace(dynamic_batch_enable=True),
    )
    t = object.__new__(cls)
    t.args = args
    t.actor = StandInActor(old.detach(), torch.randn(B, T - 1))
    t.strategy = SimpleNamespace(
        ring_attn_group=None, backward=lambda loss, model, optim: loss.backward(),
        optimizer_step=lambda *a, **k: None, get_grad_norm=lambda model: 0.0,
    )  # fmt: skip
    t.actor_loss_fn = PolicyLoss()
    t.aux_loss, t.ema_model, t.actor_optim = False, None, None
    t.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-6])
    t.replay_buffer = SimpleNamespace(dynamic_optimizer_step=[1], untrained_counts=lambda: [0, 0])
    info = {"dp_size": 1, "batch_num_tokens": torch.tensor(40.0), "global_batch_size": torch.tensor(6.0)}
    return t, exp, adv, weights, info


def test_training_step_weights_kl_and_entropy_by_the_sequence_weights():
    t, exp, adv, w, info = trainer_and_batch(DPPOActorTrainer)
    t.training_step(copy.deepcopy(exp), 0.05, 0, dict(info))
    got = t.actor.theta.grad.clone()

    # by hand: folded policy loss + kl_ctl * weighted KL - entropy_coef * weighted entropy
    theta = torch.tensor(0.2, requires_grad=True)
    logp = (t.actor.old + theta * t.actor.feature) * exp.action_mask
    entropy = 1.0 + theta * t.actor.feature.abs()
    policy = PolicyLoss()(logp, exp.action_log_probs, exp.advantages, exp.action_mask, **info)[0]
    kl = compute_approx_kl(
        logp, exp.base_action_log_probs, log_probs_old=exp.action_log_probs, kl_estimator="k3"
    )
    loss = (
        policy
        + 0.05 * weighted_aggregate(kl, exp.action_mask, w, 40.0)
        - 0.01 * weighted_aggregate(entropy, exp.action_mask, w, 40.0)
    )
    (want,) = torch.autograd.grad(loss, theta)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)

    # the unweighted host step differs (so the check above has teeth)
    host, exp2, *_ = trainer_and_batch(ppo_actor.ActorPPOTrainer)
    host.training_step(exp2, 0.05, 0, dict(info))
    assert not torch.allclose(host.actor.theta.grad, got)
    assert ppo_actor.aggregate_loss is host_loss.aggregate_loss  # the swap is undone


def test_the_swap_weights_rows_and_leaves_policy_loss_alone():
    loss = torch.rand(3, 5)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]).bool()
    w = torch.tensor([2.0, 0.5, 0.0])
    with weighted_aux_losses(w):
        token = ppo_actor.aggregate_loss(loss, mask, dp_size=2, batch_num_tokens=torch.tensor(9.0))
        seq = ppo_actor.aggregate_loss(loss, mask, token_level_loss=False, dp_size=1, global_batch_size=4.0)
        assert host_loss.aggregate_loss is not ppo_actor.aggregate_loss
    torch.testing.assert_close(token, weighted_aggregate(loss, mask, w, 9.0, token_level=True, dp_size=2))
    torch.testing.assert_close(seq, weighted_aggregate(loss, mask, w, 4.0, token_level=False))
    assert ppo_actor.aggregate_loss is host_loss.aggregate_loss


def test_without_weights_the_host_step_runs_unchanged():
    t, exp, _, _, info = trainer_and_batch(DPPOActorTrainer)
    host, exp2, *_ = trainer_and_batch(ppo_actor.ActorPPOTrainer)
    exp.info.pop(SAMPLE_WEIGHT)
    exp2.info.pop(SAMPLE_WEIGHT)
    t.training_step(exp, 0.05, 0, dict(info))
    host.training_step(exp2, 0.05, 0, dict(info))
    assert torch.equal(t.actor.theta.grad, host.actor.theta.grad)


def test_ppo_train_reports_the_trained_and_filler_counts_of_its_micro_batches(monkeypatch):
    """Counted in training_step from each micro-batch's weights (0: a filler), per PPO epoch."""
    t, exp, _, _, info = trainer_and_batch(DPPOActorTrainer)
    exp.info[SAMPLE_WEIGHT] = torch.tensor([2.0, 0.0, 4.0, 1.25])  # row 1 is a zero-weight filler
    t.max_epochs = 2

    def two_epochs(self, kl_ctl):  # OpenRLHF's ppo_train: every micro-batch once per epoch
        for _ in range(self.max_epochs):
            self.training_step(copy.deepcopy(exp), kl_ctl, 0, dict(info))
        return {"policy_loss": 0.1}

    monkeypatch.setattr(ppo_actor.ActorPPOTrainer, "ppo_train", two_epochs)
    t.replay_buffer.untrained_counts = lambda: [2, 7]  # what the buffer held and no micro-batch trained
    tokens = exp.action_mask.sum(-1).tolist()  # [5, 3, 5, 5]
    status = t.ppo_train(0.05)
    assert status == {
        "policy_loss": 0.1,
        "samples/trained": 3.0,
        "tokens/trained": float(tokens[0] + tokens[2] + tokens[3]),
        "samples/fillers": 1.0,
        "tokens/fillers": float(tokens[1]),
        "samples/untrained": 2.0,
        "tokens/untrained": 7.0,
    }
    assert t.ppo_train(0.05)["samples/trained"] == 3.0  # counts start again at every ppo_train


def test_without_dynamic_batching_a_partial_micro_batch_is_refused_before_training(monkeypatch):
    """OpenRLHF's unpacked loader drops a last, partial micro-batch (drop_last): refused by name, with
    nothing trained; whole micro-batches go to the host's ppo_train."""
    from openrlhf_dppo.adapters.actor import DPPOReplayBuffer

    t, exp, _, _, _ = trainer_and_batch(DPPOActorTrainer)
    t.args.train.dynamic_batch_enable = False
    t.max_epochs = 1
    trained = []
    monkeypatch.setattr(ppo_actor.ActorPPOTrainer, "ppo_train", lambda self, kl: trained.append(1) or {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # the buffer names a (unused) CUDA device
    t.replay_buffer = DPPOReplayBuffer(3, 0, True, False, False)  # --train.micro_batch_size 3
    t.replay_buffer.items = [exp] * 4
    with pytest.raises(RuntimeError, match=r"holds 4 rollouts, not a multiple of --train.micro_batch_size 3"):
        t.ppo_train(0.05)
    assert not trained
    t.replay_buffer.items = [exp] * 6
    assert t.ppo_train(0.05)["samples/trained"] == 0.0 and trained == [1]
