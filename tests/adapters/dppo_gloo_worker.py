"""Worker of the 2-process gloo test in test_dispatch.py (a module so that spawn can import it)."""

import os
from types import SimpleNamespace

import torch
import torch.distributed as dist


def _loss(exp, info, theta):
    from openrlhf.models import PolicyLoss

    feature = (exp.sequences[:, 1:] % 3).float() - 1.0
    new = exp.action_log_probs + theta * feature * exp.action_mask
    return PolicyLoss()(new, exp.action_log_probs, exp.advantages, exp.action_mask, **info)[0]


def run(rank, world, port, payload, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.current_device = lambda: 0  # NaiveReplayBuffer names a CUDA device; nothing is moved there
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from openrlhf.utils.loss_utils import get_loss_batch_info

    from openrlhf_dppo.adapters.actor import DPPOReplayBuffer, micro_batch_counts, step_counts

    data = torch.load(payload, weights_only=False)
    strategy = SimpleNamespace(args=None)  # no device mesh: the default (world) group is the dp group
    buffer = DPPOReplayBuffer(1, 0, True, True, True)
    buffer.append(data["ranks"][rank])
    buffer.setup_dynamic_batch(strategy)
    total = torch.zeros(())
    counts = torch.zeros(4, dtype=torch.float64)
    for step in range(len(buffer)):
        mb = buffer.collate_fn([buffer[step]])
        counts += micro_batch_counts(mb)
        info = get_loss_batch_info(
            strategy, mb.action_mask, replay_buffer=buffer, step=step, dynamic_batch=True
        )
        assert info["dp_size"] == world
        total = total + _loss(mb, info, data["theta"])
    dist.all_reduce(total, op=dist.ReduceOp.SUM)  # DeepSpeed averages gradients over the dp ranks
    result = {"micro_batches": len(buffer), "loss": float(total) / world}
    # as after two PPO epochs, summed over ranks (the plan trains every item: nothing left untrained)
    result["counts"] = step_counts(counts * 2, buffer.untrained_counts(), 2, strategy)

    # a plan whose rank 1 lost its last micro-batch must fail on BOTH ranks before any backward
    bad = DPPOReplayBuffer(1, 0, True, True, True)
    bad.append(data["ranks"][rank])
    if rank == 1:
        last = max(float(it.info["_dppo_mb"]) for it in bad.items)
        bad.items = [it for it in bad.items if float(it.info["_dppo_mb"]) != last]
    try:
        bad.setup_dynamic_batch(strategy)
        result["unequal_error"] = ""
    except RuntimeError as err:
        result["unequal_error"] = str(err)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _host_strategy(args):
    """What NaiveReplayBuffer.setup_dynamic_batch reads from the DeepSpeed strategy: the args, the dp
    group of the device mesh (here the world) and a max all-reduce."""

    def all_reduce(t, op="mean"):
        assert op == "max"
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    mesh = {"dp": SimpleNamespace(get_group=lambda: dist.group.WORLD)}
    return SimpleNamespace(args=args, ds_device_mesh=mesh, all_reduce=all_reduce)


def run_grpo(rank, world, port, payload, out_dir):
    """GRPO items (no plan) through the DPPO buffer and, for comparison, OpenRLHF's own buffer."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.current_device = lambda: 0  # NaiveReplayBuffer names a CUDA device; nothing is moved there
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
    from openrlhf.utils.loss_utils import get_loss_batch_info

    from openrlhf_dppo.adapters.actor import DPPOReplayBuffer, micro_batch_counts, step_counts

    data = torch.load(payload, weights_only=False)
    strategy = _host_strategy(data["args"])
    result = {}
    for name, cls in (("host", NaiveReplayBuffer), ("dppo", DPPOReplayBuffer)):
        torch.cuda.current_device = lambda: 0  # only to name the buffer's (unused) target device
        buffer = cls(1, 0, True, True, True)
        buffer.append(data["ranks"][rank])
        torch.cuda.current_device = lambda: "cpu"  # the host's all-reduce tensors: gloo wants CPU ones
        buffer.setup_dynamic_batch(strategy)
        total, counts, seen = torch.zeros(()), torch.zeros(4, dtype=torch.float64), []
        for step in range(len(buffer)):
            mb = buffer.collate_fn([buffer[step]])
            counts += micro_batch_counts(mb)
            seen.extend(buffer.dynamic_indices[step])
            info = get_loss_batch_info(
                strategy, mb.action_mask, replay_buffer=buffer, step=step, dynamic_batch=True
            )
            total = total + _loss(mb, info, data["theta"])
        dist.all_reduce(total, op=dist.ReduceOp.SUM)  # DeepSpeed averages gradients over the dp ranks
        result[name] = {
            "micro_batches": len(buffer),
            "optimizer_steps": sum(buffer.dynamic_optimizer_step),
            "loss_scales": sum(buffer.dynamic_sample_loss_scale),
            "num_tokens": list(buffer.dynamic_batch_num_tokens),
            "num_seqs": list(buffer.dynamic_global_batch_size),
            "seen": sorted(seen),
            "held": len(buffer.items),
            "loss": float(total) / world,
            "counts": step_counts(counts, getattr(buffer, "untrained_counts", lambda: [0, 0])(), 1, strategy),
        }
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
