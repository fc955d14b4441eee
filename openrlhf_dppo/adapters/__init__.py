"""Thin subclasses that plug ``openrlhf_dppo.core`` into OpenRLHF 0.11.2's Ray PPO pipeline.

Where each part sits (one overridden seam each; see the module docstrings):
- ``trainer``            PPOTrainer (Ray actor, single controller): swaps in the two below, makes each
                         step's ``StepContext`` and hands it down, the step limit, metrics + accounting
                         check + run directory, prompt history in the checkpoints.
- ``step``               ``StepContext``: what one step carries trainer -> generator -> maker -> trainer.
- ``samples_generator``  SamplesGenerator: prompt pruning before vLLM, one draw per step (no buffer), the
                         groups dynamic filtering drops, generation counts, reward checks (both arms).
- ``experience_maker``   RemoteExperienceMaker.make_experience_batch: full-group advantages, completion
                         pruning before the forwards, weights folded, normalisers, packing plan.
- ``dispatch``           kept items -> per-rank packed micro-batches (core.pack), plan carried in info.
- ``actor``              PolicyModelActor / ActorPPOTrainer / NaiveReplayBuffer on the DeepSpeed ranks:
                         follow the plan, weight KL-in-loss and entropy terms, count what is trained.
- ``packing``            registers OpenRLHF's own partitioning as the ``openrlhf`` packer.

``install(cfg)`` points OpenRLHF at the DPPO classes; ``openrlhf_dppo.cli.train_dppo_ray`` calls it
right before OpenRLHF's ``train(args)``.
"""

from __future__ import annotations

from openrlhf_dppo._host import prepare_host

# Every adapter module imports OpenRLHF: the version guard and the flash-attn stand-in come first.
prepare_host()


def install(cfg) -> dict:
    """Install the DPPO classes where OpenRLHF's ``train`` looks them up; returns what was replaced.

    ``train`` imports ``PPOTrainer`` from ``openrlhf.trainer.ppo_trainer`` when it runs, and uses the
    ``PolicyModelActor`` global of ``openrlhf.cli.train_ppo_ray``. The trainer is always replaced (it
    writes the run directory); the policy actor only when DPPO is on (``--dppo.enable false`` keeps
    OpenRLHF's actor: same code path, same numbers).
    """
    from openrlhf.cli import train_ppo_ray
    from openrlhf.trainer import ppo_trainer

    from openrlhf_dppo.adapters.trainer import DPPOTrainer

    replaced = {"PPOTrainer": ppo_trainer.PPOTrainer}
    ppo_trainer.PPOTrainer = DPPOTrainer
    if cfg.enable:
        from openrlhf_dppo.adapters.actor import DPPOPolicyModelActor

        replaced["PolicyModelActor"] = train_ppo_ray.PolicyModelActor
        train_ppo_ray.PolicyModelActor = DPPOPolicyModelActor
    return replaced
