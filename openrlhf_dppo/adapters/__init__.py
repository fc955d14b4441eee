"""Thin subclasses that plug ``openrlhf_dppo.core`` into OpenRLHF 0.11.2's Ray PPO pipeline, one seam per
module (docs/DESIGN.md, "One training step"). Importing them changes nothing; ``install(cfg, run)`` is the
one place that patches the host (docs/DESIGN.md, "Host names replaced").
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
    """Install the DPPO trainers and policy actor (both arms) where OpenRLHF's ``train`` looks them up;
    returns what was replaced. cfg: the CLI's validated ``DPPOConfig``; run: ``run_dir.RunMeta``."""
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
