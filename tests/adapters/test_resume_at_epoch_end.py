"""The sync trainer's checkpoint after an epoch's short last batch: the batch's draw ran the prompt data
out, and the dataloader's saved state restarts the data, so the checkpoint names the next episode (the
async generator's: tests/adapters/test_async_trainer.py, which resumes a real StatefulDataLoader)."""

from __future__ import annotations

from types import SimpleNamespace

from openrlhf_dppo.adapters import trainer as trainer_module


def test_a_checkpoint_after_the_draw_that_ran_the_prompts_out_names_the_next_episode(monkeypatch):
    saved = []
    monkeypatch.setattr(
        trainer_module.DPPOSteps,
        "save_logs_and_checkpoints",
        lambda self, step, logs=None, states=None: saved.append(states and states["episode"]),
    )
    t = object.__new__(trainer_module._DPPOTrainer)
    t.samples_generator = SimpleNamespace(_dataloader_iter=iter(()))  # mid-epoch
    t.save_logs_and_checkpoints(2, {}, {"episode": 0, "global_step": 2})
    t.samples_generator._dataloader_iter = None  # this step's draw ran the data out (a short last batch)
    t.save_logs_and_checkpoints(3, {}, {"episode": 0, "global_step": 3})
    t.save_logs_and_checkpoints(4, {}, None)  # logs only
    assert saved == [0, 1, None]
