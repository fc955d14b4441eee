"""Thin subclasses that plug ``openrlhf_dppo.core`` into OpenRLHF 0.11.2's Ray PPO pipeline.

One step, in the order it runs (one overridden seam each; see the module docstrings):
- ``samples_generator``  SamplesGenerator.generate_samples: makes the step's context; prompt pruning
                         before vLLM, one never-empty draw per step, what dynamic filtering drops,
                         generation counts, reward checks (both arms); the step limit.
- ``trainer``            PPOTrainer (Ray actor, single controller): builds the generator and the maker from
                         the CLI's config; rollout statistics, metrics, the accounting check, the run
                         directory, the prompt history in the checkpoints.
- ``experience_maker``   RemoteExperienceMaker.make_experience_batch(rollouts): full-group advantages,
                         completion pruning before the forwards, weights folded, normalisers, the plan;
                         for GRPO, OpenRLHF's maker on float64 rewards.
- ``dispatch``           kept items -> per-rank packed micro-batches (core.pack), the plan carried in
                         ``Experience.info`` and read back on the ranks; the experience-side forward batches.
- ``actor``              PolicyModelActor / ActorPPOTrainer / NaiveReplayBuffer on the DeepSpeed ranks:
                         follow the plan, weight KL-in-loss and entropy terms, count what is trained.
- ``async_trainer``      ``--train.async_enable``: OpenRLHF's async controller, generator and training
                         actors with the same parts (the draw, history and rate control in the generator).
- ``step``               what every part shares: the types that carry one step (``StepContext`` on
                         ``Rollouts.ctx``, the plan on ``PlannedExperiences.plan``), the run's shape from
                         OpenRLHF's arguments, the accounting check, the prompt history's update, Ray
                         subclassing. The adapters import it, not one another's helpers.

Importing any of them changes nothing (the layer test checks it). ``install(cfg, run)`` is the one
place that patches the host; ``openrlhf_dppo.cli.train_dppo_ray`` calls it right before OpenRLHF's
``train(args)``, after ``_host.prepare_host()`` (version guard, flash-attn stand-in).

Where a host name is replaced (the host calls it by a module-global name and leaves no seam):

| replaced name                            | by                      | where, for how long            | why there is no seam |
|------------------------------------------|-------------------------|--------------------------------|----------------------|
| ``ppo_trainer.PPOTrainer``               | ``TrainerFactory``      | ``install``, the driver        | ``train()`` constructs the trainer by that name, with its own arguments only: the factory adds the validated config and the run metadata |
| ``ppo_trainer_async.PPOTrainerAsync``    | ``TrainerFactory``      | ``install``, the driver        | the same, under ``--train.async_enable`` (``train()`` imports it from that module when it runs) |
| ``train_ppo_ray.PolicyModelActor``       | ``DPPOPolicyModelActor``| ``install``, the driver        | ``train()`` builds the actor group from that name |
| ``ppo_actor.ActorPPOTrainer``            | ``DPPOActorTrainer``    | one ``init_model_from_pretrained`` | ``PolicyModelActor`` constructs it by that name inside a long method |
| ``ppo_trainer.balance_experiences``      | ``dispatch.planned_balance`` | one DPPO ``train_step``   | a function, not a method: ``train_step`` calls it by that name; the replacement is stateless and reads the plan from its argument |
| ``ppo_actor.aggregate_loss``             | its weighted version    | one ``training_step`` with weights | ``training_step`` reduces the KL / entropy terms through that function and passes no per-sequence weight |

The one piece of state an adapter keeps between host calls: ``DPPOActorTrainer._counts`` (actor side),
what the micro-batches of one ``ppo_train`` call train, added up by each ``training_step`` and read when
``ppo_train`` returns. The host's ``ppo_train`` calls ``training_step`` in its own loop and keeps only
per-micro-batch means of what that returns, so an exact count has no other way back; it is reset at the
start of every ``ppo_train`` and lives no longer than that call.
"""

from __future__ import annotations

from openrlhf_dppo._host import guard_version

# The adapters are written against one OpenRLHF: a check only, it changes nothing.
guard_version()


class TrainerFactory:
    """What ``install`` puts where OpenRLHF's ``train`` looks up ``PPOTrainer``. ``train`` only calls
    ``PPOTrainer.remote(...)`` with OpenRLHF's arguments; this adds the CLI's validated ``DPPOConfig``
    and the run's ``RunMeta`` as explicit constructor arguments of the DPPO trainer actor."""

    def __init__(self, trainer_class, dppo, run) -> None:
        self.trainer_class, self.dppo, self.run = trainer_class, dppo, run

    def remote(self, *args, **kwargs):
        return self.trainer_class.remote(*args, dppo=self.dppo, run=self.run, **kwargs)


def install(cfg, run) -> dict:
    """Install the DPPO classes where OpenRLHF's ``train`` looks them up; returns what was replaced.

    cfg: the CLI's validated ``DPPOConfig``; run: ``run_dir.RunMeta`` (command line, start time, run
    directory and step limit).
    All three (the sync trainer, the async controller, the policy actor) are always replaced; the trainer
    (sync) or training actor (async) writes the run directory. The policy actor counts what its
    micro-batches train (the accounting check's ``samples|tokens/trained``, and ``untrained``: what the
    replay buffer holds and no micro-batch trains) in both arms; with ``--dppo.enable false`` it runs
    OpenRLHF's training step unchanged and its replay buffer makes OpenRLHF's dynamic batches (under
    ``--dppo.short_batch train`` plus one step for a batch smaller than one train batch:
    ``DPPOReplayBuffer._add_short_step``).
    """
    from openrlhf.cli import train_ppo_ray
    from openrlhf.trainer import ppo_trainer, ppo_trainer_async

    from openrlhf_dppo.adapters.async_trainer import DPPOTrainerAsync
    from openrlhf_dppo.adapters.trainer import DPPOTrainer

    replaced = {"PPOTrainer": ppo_trainer.PPOTrainer, "PPOTrainerAsync": ppo_trainer_async.PPOTrainerAsync}
    ppo_trainer.PPOTrainer = TrainerFactory(DPPOTrainer, cfg, run)
    ppo_trainer_async.PPOTrainerAsync = TrainerFactory(DPPOTrainerAsync, cfg, run)
    from openrlhf_dppo.adapters.actor import DPPOPolicyModelActor

    replaced["PolicyModelActor"] = train_ppo_ray.PolicyModelActor
    train_ppo_ray.PolicyModelActor = DPPOPolicyModelActor
    return replaced
