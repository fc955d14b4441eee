"""One DeepSpeed rank of test_dp_gradient.py (a module, so that ``torch.multiprocessing.spawn`` can
import it): the real DPPO policy actor trains its share of a fixed dispatch plan for one step."""

from __future__ import annotations

import os

import torch


def fp32_aware(convert):
    """OpenRLHF's ``convert_to_torch_dtype`` knows bf16 / fp16 only: "fp32" maps to torch.float32 (the
    DeepSpeed config then enables neither bf16 nor fp16, i.e. plain fp32 ZeRO-3)."""

    def convert_to_torch_dtype(param_dtype):
        return torch.float32 if param_dtype == "fp32" else convert(param_dtype)

    return convert_to_torch_dtype


def run(rank: int, world: int, port: int, payload: str, out_dir: str) -> None:
    # what OpenRLHF's BaseDistributedActor sets in a Ray actor (its __init__ asks Ray for the GPU ids)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK="0"
    )
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from openrlhf_dppo._host import prepare_host
    from openrlhf_dppo.compat import cpu

    prepare_host()
    cpu.install(cpu.RAY_WORKER)  # the CPU patches every Ray worker of the pipeline gets

    import deepspeed
    from openrlhf.utils import get_strategy, utils

    utils.convert_to_torch_dtype = fp32_aware(utils.convert_to_torch_dtype)

    from openrlhf_dppo.adapters.actor import DPPOActorTrainer, DPPOPolicyModelActor
    from openrlhf_dppo.adapters.step import unwrap_actor_class

    data = torch.load(payload, weights_only=False)
    args = data["args"]
    strategy = get_strategy(args)
    actor_cls = unwrap_actor_class(DPPOPolicyModelActor)
    actor = object.__new__(actor_cls)  # the Ray actor's __init__ only sets the environment above
    actor.init_model_from_pretrained(strategy, args.actor.model_name_or_path, max_steps=1, vllm_engines=None)
    trainer = actor.trainer
    assert isinstance(trainer, DPPOActorTrainer), type(trainer)

    micro_batches = []  # (sequences, action tokens) of every micro-batch this rank trains
    training_step = trainer.training_step

    def counted(experience, *a, **kw):
        micro_batches.append((int(experience.action_mask.shape[0]), int(experience.action_mask.sum())))
        return training_step(experience, *a, **kw)

    trainer.training_step = counted
    actor.append(data["ranks"][rank])
    status = actor.fit(kl_ctl=data["kl_coef"])

    params = [p for _, p in actor.actor.model.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(params, enabled=args.ds.zero_stage == 3):
        after = {n: p.detach().clone() for n, p in actor.actor.model.module.named_parameters()}
    result = {
        "micro_batches": micro_batches,
        "status": status,
        "dtypes": {str(p.dtype) for p in after.values()},
    }
    if rank == 0:
        result["params"] = after
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()
