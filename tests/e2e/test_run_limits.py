"""End to end, what the time-to-accuracy runs rely on, through ``python -m openrlhf_dppo.cli.train_dppo_ray``
on CPU (the tiny model and task of test_tiny_pipeline.py):
  * ``--dppo.max_steps`` ends a 3-episode GRPO run after 2 steps; a fresh run evaluates at step 0 and
    on the --eval.steps schedule, each eval line with ``timing/eval``; ``rollout/reward_ht`` equals the
    reward mean (no prompt pruning) and the four accounting counts add up;
  * a reward function that returns NaN from step 2 on stops the run with a message naming the reward
    file and the step, after one trained step and well before the run's time limit (no hang).
About 3 minutes on 2 cores once the tiny assets are built.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tiny_pipeline import TINY, common_flags, read_jsonl, run_cli, tiny, train_rows  # noqa: E402

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets


def test_max_steps_stops_the_run_after_its_evaluation(tiny, tmp_path):
    out = str(tmp_path / "grpo_limited")
    flags = common_flags(out, episodes=3) + ["--dppo.method", "grpo", "--dppo.max_steps", "2"]
    flags += [
        "--eval.dataset",
        f"{TINY}/data/eval.jsonl",
        "--eval.steps",
        "2",
        "--eval.n_samples_per_prompt",
        "1",
    ]
    flags += ["--eval.temperature", "0"]
    run = run_cli(out, flags)
    rows = train_rows(run)
    assert [r["step"] for r in rows] == [1, 2]  # 3 episodes of 2 steps each, stopped after 2
    evals = [r for r in run["metrics"] if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    assert all(r["timing/eval"] > 0 and 0.0 <= r["eval_default_pass1"] <= 1.0 for r in evals), evals
    for r in rows:
        assert r["rollout/reward_ht"] == r["rollout/reward_mean"]
        for unit in ("samples", "tokens"):
            parts = [r[f"{unit}/{k}"] for k in ("trained", "pruned", "filtered")]
            assert r[f"{unit}/generated"] == sum(parts) and parts[1] == parts[2] == 0, r
    status = json.load(open(os.path.join(out, "status.json")))
    assert status["state"] == "finished" and status["step"] == 2 and status["max_steps"] == 2


NAN_FROM_STEP_2 = """
import itertools
import torch

_calls = itertools.count()  # one call per response; step 1 makes {n} of them


def reward_func(queries, prompts, labels):
    nan = next(_calls) >= {n}
    return {{"rewards": torch.full((len(queries),), float("nan") if nan else 0.0)}}
"""


def test_a_reward_function_returning_nan_stops_the_run_naming_the_file_and_the_step(tiny, tmp_path):
    out = str(tmp_path / "nan_reward")
    os.makedirs(out)
    reward_file = os.path.join(out, "nan_from_step_2.py")
    with open(reward_file, "w") as fh:
        fh.write(textwrap.dedent(NAN_FROM_STEP_2.format(n=8 * 4)))  # PROMPTS x SAMPLES
    # no prompt pruning: step 1 rolls out all 8 prompts, the 32 rewards before the first NaN
    flags = common_flags(out, episodes=2) + ["--dppo.method", "dppo", "--dppo.completion_prune_rate", "0.5",
                                             "--dppo.prompt_rate_control", "fixed", "--dppo.prompt_prune_rate", "0"]  # fmt: skip
    flags[flags.index("--reward.remote_url") + 1] = reward_file
    run = run_cli(out, flags, expect_ok=False)
    assert run["returncode"] != 0
    assert "RewardError" in run["log"] and f"{reward_file} returned a non-finite reward [nan]" in run["log"]
    assert "at step 2" in run["log"]
    assert [r["step"] for r in train_rows({"metrics": read_jsonl(os.path.join(out, "metrics.jsonl"))})] == [1]
    status = json.load(open(os.path.join(out, "status.json")))
    assert status["state"] == "failed" and status["step"] == 1
