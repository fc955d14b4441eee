"""Device discipline: the code a GPU rank runs keeps every tensor on the micro-batch's device.

On a GPU rank OpenRLHF's ``ppo_train`` moves each micro-batch to CUDA before ``training_step``; a CPU
tensor mixed into it fails there and nowhere on a CPU-only machine. These tests run that code with the
Experience on a second device: the stand-in of ``second_device.py`` on CPU (CUDA's device rules, CPU
memory), or the real GPU with ``DPPO_SECOND_DEVICE=cuda`` (``benchmarks/gpu_smoke.sh``, stage b). The
first test checks the stand-in against the rules it claims, so that on a GPU the same test checks them
against CUDA itself.
"""

from __future__ import annotations

import copy
import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch
from openrlhf.trainer.ray import ppo_actor

from openrlhf_dppo.adapters.actor import DPPOActorTrainer, DPPOReplayBuffer, micro_batch_counts
from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT, build_dispatch, mark_short_batch_rule
from openrlhf_dppo.core import fold_weights

B, T, PROMPT = 6, 10, 3  # sequences, tokens a sequence (prompt + response), prompt tokens


def test_the_second_device_enforces_cudas_device_rules(second_device):
    dev = second_device
    on = torch.ones(4, device=dev)
    assert on.device.type == "cuda" and (on + torch.tensor(2.0)).device.type == "cuda"  # a CPU scalar is fine
    assert on[torch.tensor([True, False, True, True])].device.type == "cuda"  # a CPU index is fine
    assert on.cpu().device.type == "cpu" and on.to(torch.float64).device.type == "cuda"
    for mix in (
        lambda: torch.zeros(4) + on,  # CPU (4,) with CUDA (4,)
        lambda: torch.stack([torch.tensor(1.0), on.sum()]),  # stack checks every input
        lambda: torch.zeros(4)[on > 0],  # a CPU tensor indexed by a CUDA mask
        lambda: on.numpy(),
    ):
        with pytest.raises((RuntimeError, TypeError)):
            mix()


def _experience(weights: torch.Tensor | None, seed: int = 0) -> Experience:
    """B padded sequences on the CPU, as the replay buffer holds them (right-padded responses)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T - 1, dtype=torch.bool)
    ends = torch.randint(PROMPT + 2, T, (B,), generator=g)
    for i, end in enumerate(ends.tolist()):
        mask[i, PROMPT - 1 : end - 1] = True
    attention = torch.zeros(B, T, dtype=torch.long)
    for i, end in enumerate(ends.tolist()):
        attention[i, :end] = 1
    old = -torch.rand(B, T - 1, generator=g) * mask
    adv = torch.randn(B, generator=g)[:, None].expand(B, T - 1) * mask
    info = {"reward": torch.rand(B, generator=g)}
    if weights is not None:
        adv = fold_weights(adv, weights)
        info[SAMPLE_WEIGHT] = weights
    return Experience(
        sequences=torch.randint(3, 30, (B, T), generator=g) * attention, attention_mask=attention,
        action_mask=mask, action_log_probs=old, base_action_log_probs=old.clone(), advantages=adv,
        info=info, total_length=attention.sum(-1).float(), response_length=mask.sum(-1).float(),
    )  # fmt: skip


@pytest.mark.parametrize(
    "weights", [None, torch.tensor([2.0, 0.0, 1.0, 0.5, 4.0, 0.0])], ids=["grpo", "dppo"]
)
def test_micro_batch_counts_live_on_the_micro_batch_device(second_device, weights):
    exp = _experience(weights)
    tokens = exp.action_mask.sum(-1).tolist()
    live = [True] * B if weights is None else [w != 0 for w in weights.tolist()]
    exp.to_device(second_device)  # what ppo_train does before training_step
    counts = micro_batch_counts(exp)
    assert counts.device.type == second_device.type
    want = [sum(live), sum(t for t, k in zip(tokens, live) if k), B - sum(live)]
    want.append(sum(t for t, k in zip(tokens, live) if not k))
    assert counts.tolist() == [float(x) for x in want]
    total = counts + micro_batch_counts(exp)  # training_step's running sum, on one device
    assert total.tolist() == [2.0 * x for x in want]


class TinyPolicy(torch.nn.Module):
    """Per-token log-probs that move with one parameter (the real Actor needs a GPU model), computed on
    the micro-batch's device; (B, T - 1) as OpenRLHF's Actor returns them."""

    def __init__(self, device):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor(0.3, device=device))

    def forward(self, sequences, action_mask, attention_mask=None, return_output=False, **_):
        feature = ((sequences[:, 1:] % 5).to(torch.float32) - 2.0) / 10.0
        logp = (self.theta * feature - 1.0) * action_mask
        entropy = 1.0 + self.theta * feature.abs()
        return logp, SimpleNamespace(entropy=entropy)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(second_device, monkeypatch):
    """A one-rank process group on the device's backend (gloo for the stand-in, nccl on a GPU)."""
    backend = "nccl" if second_device.type == "cuda" and torch.cuda.is_available() else "gloo"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group(backend, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _trainer(device, group, entropy: bool) -> DPPOActorTrainer:
    """OpenRLHF's ActorPPOTrainer state that ppo_train / training_step read, with a DPPO buffer."""
    args = SimpleNamespace(
        algo=SimpleNamespace(kl=SimpleNamespace(use_loss=False, init_coef=0.0)),
        actor=SimpleNamespace(entropy_coef=0.01 if entropy else None),
        train=SimpleNamespace(dynamic_batch_enable=True, batch_size=2 * B, max_tokens_per_gpu=4 * T),
        rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=B),
        ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1),
    )
    steps = []

    def all_reduce(value, op="mean"):
        if isinstance(value, dict):  # one rank: the host's status reduction is the identity
            return value
        dist.all_reduce(value, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
        return value

    t = object.__new__(DPPOActorTrainer)
    t.args, t.max_epochs, t.dataloader_pin_memory = args, 2, False
    t.actor = TinyPolicy(device)
    t.strategy = SimpleNamespace(
        args=args, ring_attn_group=None, ds_device_mesh={"dp": SimpleNamespace(get_group=lambda: group)},
        all_reduce=all_reduce, is_rank_0=lambda: True, backward=lambda loss, model, optim: loss.backward(),
        optimizer_step=lambda *a, **k: steps.append(1), get_grad_norm=lambda model: 0.0,
    )  # fmt: skip
    t.actor_loss_fn = PolicyLoss()
    t.aux_loss, t.ema_model, t.actor_optim = False, None, None
    t.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-6])
    t.replay_buffer = DPPOReplayBuffer(1, 0, True, False, True)
    t.optimizer_steps = steps
    return t


@pytest.mark.parametrize("arm", ["grpo", "grpo-short-train", "dppo", "cppo"])
def test_ppo_train_runs_openrlhfs_loop_on_the_device_in_both_arms(second_device, one_rank, arm):
    """OpenRLHF's own ppo_train loop (micro-batches moved to the device, training_step, the status
    reduction) through DPPOActorTrainer and DPPOReplayBuffer; counts and gradient come back right."""
    t = _trainer(second_device, one_rank, entropy=arm == "dppo")
    if arm == "dppo":
        weights = torch.tensor([2.0, 0.0, 1.0, 0.5, 4.0, 1.0])  # one zero-weight filler
        exp = _experience(weights, seed=1)
        items = [copy.copy(e) for e in _split(exp)]
        plan = build_dispatch(items, 1, 4 * T, 1, float(exp.action_mask.sum()), float(B))
        t.replay_buffer.append(plan.rank_experiences()[0])
        live = weights != 0
    elif arm == "cppo":  # the kept completions at weight 1, normalised by their own tokens and count
        exp = _experience(torch.ones(B), seed=5)
        items = [copy.copy(e) for e in _split(exp)]
        plan = build_dispatch(items, 1, 4 * T, 1, float(exp.action_mask.sum()), float(B))
        t.replay_buffer.append(plan.rank_experiences()[0])
        live = torch.ones(B, dtype=torch.bool)
    else:
        exp = _experience(None, seed=2)
        mark_short_batch_rule([exp], arm == "grpo-short-train")  # B < one train batch of 2 B
        t.replay_buffer.append(exp)
        live = torch.ones(B, dtype=torch.bool)
    tokens = exp.action_mask.sum(-1).to(torch.float64)
    status = t.ppo_train(0.0)
    if arm == "grpo":  # OpenRLHF's rule: a batch smaller than one train batch is not trained
        assert status["samples/trained"] == 0.0 and status["samples/untrained"] == B
        assert status["tokens/untrained"] == float(tokens.sum()) and not t.optimizer_steps
        assert t.actor.theta.grad is None
        return
    assert status["samples/trained"] == float(live.sum()) and status["samples/untrained"] == 0.0
    assert status["tokens/trained"] == float(tokens[live].sum())
    assert status["samples/fillers"] == float((~live).sum())
    assert len(t.optimizer_steps) == t.max_epochs  # one optimizer step per PPO epoch
    assert t.actor.theta.grad is not None and t.actor.theta.grad.device.type == second_device.type
    assert torch.isfinite(t.actor.theta.grad).all() and float(t.actor.theta.grad.abs()) > 0
    from openrlhf.models import loss as host_loss

    assert ppo_actor.aggregate_loss is host_loss.aggregate_loss  # the weighted swap was undone


def _split(exp: Experience) -> list[Experience]:
    from openrlhf.trainer.ppo_utils.experience import split_experience_batch

    return split_experience_batch(copy.deepcopy(exp))


def test_the_folded_weights_and_the_weighted_aux_terms_stay_on_the_device(second_device):
    """The weights folded into A (``core.fold_weights``) and the weighted KL / entropy reduction of
    ``weighted_aux_losses`` on device tensors: results on the device, equal to the CPU result."""
    from openrlhf_dppo.adapters.actor import weighted_aux_losses

    exp = _experience(torch.tensor([2.0, 0.5, 1.0, 0.0, 4.0, 1.0]), seed=3)
    loss = torch.rand(B, T - 1)
    with weighted_aux_losses(exp.info[SAMPLE_WEIGHT]):  # the weights on the CPU, the loss on the device
        cpu = ppo_actor.aggregate_loss(loss, exp.action_mask, dp_size=1, batch_num_tokens=40.0)
        on = ppo_actor.aggregate_loss(
            loss.to(second_device), exp.action_mask.to(second_device), dp_size=1,
            batch_num_tokens=torch.tensor(40.0, device=second_device),
        )  # fmt: skip
    assert on.device.type == second_device.type
    torch.testing.assert_close(on.cpu(), cpu)
    adv = torch.randn(B, T - 1).to(second_device)
    folded = fold_weights(adv, exp.info[SAMPLE_WEIGHT].to(second_device))
    assert folded.device.type == second_device.type
    torch.testing.assert_close(folded.cpu(), fold_weights(adv.cpu(), exp.info[SAMPLE_WEIGHT]))


def test_make_experience_batch_of_planned_items_keeps_the_plan_readable_on_the_device(second_device):
    """The replay buffer reads the plan from items that may already sit on the device (no CPU
    offload): ``read_plan`` takes plain numbers from them."""
    from openrlhf_dppo.adapters.dispatch import read_plan

    exp = _experience(torch.ones(B), seed=4)
    plan = build_dispatch(_split(exp), 1, 4 * T, 1, float(exp.action_mask.sum()), float(B))
    items = plan.rank_items[0]
    for it in items:
        it.to_device(second_device)
    read = read_plan(items)
    assert read is not None and sorted(i for mb in read.indices for i in mb) == list(range(B))
    batch = make_experience_batch([items[i] for i in read.indices[0]])
    assert batch.sequences.device.type == second_device.type


def test_the_fixture_uses_the_device_it_was_asked_for(second_device):
    want = os.environ.get("DPPO_SECOND_DEVICE", "stand-in")
    assert second_device.type == "cuda"
    if want == "cuda":
        assert torch.ones(1, device=second_device).is_cuda and torch.cuda.is_available()
    else:
        assert not torch.cuda.is_available()  # the stand-in: CPU memory, cuda:0 by name


def test_cppos_keep_mask_is_made_on_the_advantages_device(second_device):
    """``core.cppo.cppo_keep_mask`` (the CPPO maker's rule) makes its mask on the device of the
    advantages it is given, and keeps there what it keeps on the CPU."""
    from openrlhf_dppo.core.cppo import cppo_keep_mask

    adv = torch.randn(5, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    adv[1] = 0.0  # an all-equal group: CPPO keeps its first k
    on = cppo_keep_mask(adv.to(second_device), 0.5)
    assert on.device.type == second_device.type and on.dtype == torch.bool
    assert torch.equal(on.cpu(), cppo_keep_mask(adv, 0.5))
    assert on.cpu().sum(-1).tolist() == [4] * 5
