"""The micro-batches of one optimizer step add up under DeepSpeed ZeRO-1/2 (dynamic batches).

OpenRLHF runs dynamic batches with DeepSpeed's ``gradient_accumulation_steps`` 1 and calls ``step()``
after the step's last micro-batch; under ZeRO stages 1 and 2 each backward is then a boundary that
replaces the gradient the earlier micro-batches left. ``DPPOActorTrainer.training_step`` marks the
boundary from the plan (``set_accumulation_boundary``). Checked with a real DeepSpeed engine on the CPU
(in a subprocess: it initialises torch.distributed), the unmarked loop beside it as the control."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_actor import trainer_and_batch

from openrlhf_dppo.adapters.actor import DPPOActorTrainer

WORKER = Path(__file__).with_name("deepspeed_accumulation_worker.py")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_marked_step_applies_every_micro_batch_and_the_host_loop_only_the_last(stage):
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = subprocess.run(
        [sys.executable, str(WORKER), str(stage)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    diff = json.loads(out.stdout.strip().splitlines()[-1])
    assert diff["marked"] < 1e-6, diff  # the summed gradient of both micro-batches
    if stage < 3:  # the control: without the mark ZeRO-1/2 loses the first micro-batch
        assert diff["host"] > 1e-3, diff
    else:  # ZeRO-3 (the GPU recipe's stage) accumulates either way: the mark changes nothing there
        assert diff["host"] < 1e-6, diff


class Recorder:
    def __init__(self):
        self.marks = []

    def set_gradient_accumulation_boundary(self, last):
        self.marks.append(last)


@pytest.mark.parametrize("dynamic", [True, False])
def test_training_step_marks_the_plans_last_micro_batch_under_dynamic_batches(dynamic):
    t, exp, _, _, info = trainer_and_batch(DPPOActorTrainer)
    t.args.train.dynamic_batch_enable = dynamic
    t.replay_buffer.dynamic_optimizer_step = [0, 0, 1]
    engine = Recorder()
    t.actor.model = engine  # OpenRLHF's Actor holds its DeepSpeed engine in .model
    for step in range(3):
        t.training_step(exp, 0.05, step, dict(info))
        t.actor.theta.grad = torch.zeros_like(t.actor.theta)
    # without dynamic batches DeepSpeed counts the boundary itself (its own accumulation steps)
    assert engine.marks == ([False, False, True] if dynamic else [])
