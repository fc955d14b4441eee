"""Run by test_accumulation_boundary.py in its own process (DeepSpeed initialises torch.distributed).

Trains one optimizer step of two micro-batches with a real DeepSpeed engine configured as OpenRLHF
configures it for dynamic batches (``gradient_accumulation_steps`` 1), ZeRO stage ``argv[1]``, plain SGD
at lr 1 (the update is the gradient), in three ways: one backward of the summed loss ("joint"); a
backward per micro-batch as OpenRLHF's loop runs them ("host"); the same with the boundary marked by
``set_accumulation_boundary`` ("marked"). Prints one JSON line: the largest parameter difference of
"host" and of "marked" from "joint"."""

import copy
import json
import os
import sys

import deepspeed
import torch

from openrlhf_dppo.adapters.actor import set_accumulation_boundary
from openrlhf_dppo.launch.ray_cluster import free_port


def main(stage: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    os.environ["LOCAL_RANK"] = "0"
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    batches = [torch.randn(5, 6), torch.randn(7, 6)]
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }

    def step(mode: str) -> torch.Tensor:
        model = copy.deepcopy(base)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), config=config
        )
        actor = type("Actor", (), {"model": engine})()  # OpenRLHF's Actor holds its engine in .model
        if mode == "joint":
            engine.backward(sum(engine(x).sum() for x in batches))
        else:
            for i, x in enumerate(batches):
                if mode == "marked":
                    set_accumulation_boundary(actor, i == len(batches) - 1)
                engine.backward(engine(x).sum())
        engine.step()
        return torch.cat([p.detach().flatten() for p in engine.module.parameters()])

    joint = step("joint")
    diff = {mode: float((step(mode) - joint).abs().max()) for mode in ("host", "marked")}
    print(json.dumps(diff))


if __name__ == "__main__":
    main(int(sys.argv[1]))
