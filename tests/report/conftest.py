"""Hand-written run directories for the compare report tests (the builders are the shared ``rundirs``
fixture of tests/conftest.py).

Two 5-step runs whose every number is chosen so that the expected speedups can be derived by hand
(the derivations are in test_speedups.py). Rewards are multiples of 1/8 so that the smoothed rewards
are exact in binary floating point.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

# GRPO: phases (gen, make_experience, ppo_train, broadcast) sum to the step total
GRPO_PHASES = [(6.0, 2.0, 1.5, 0.5), (2.0, 1.0, 0.75, 0.25), (2.0, 1.0, 0.75, 0.25), (3.0, 1.0, 0.75, 0.25)]
GRPO_PHASES.append((2.0, 1.0, 0.75, 0.25))  # totals: 10, 4, 4, 5, 4
GRPO_REWARD = [0.0, 0.25, 0.25, 0.5, 0.5]
DPPO_PHASES = [(4.0, 2.0, 1.5, 0.5), (1.0, 0.5, 0.25, 0.25), (1.0, 0.5, 0.25, 0.25), (1.5, 0.5, 0.25, 0.25)]
DPPO_PHASES.append((1.0, 0.5, 0.25, 0.25))  # totals: 8, 2, 2, 2.5, 2
DPPO_REWARD = [0.25, 0.25, 0.5, 0.5, 0.75]
PROMPT_KEEP = [1.0, 0.5, 0.5, 0.5, 0.5]
COMPLETION_KEEP = [1.0, 0.625, 0.375, 0.5, 0.5]

EVAL_RESULTS = {
    "model": "ckpt",
    "k": 4,
    "benchmarks": {
        "math500": {"avg@k": 0.5, "pass@k": 0.75, "n": 8},
        "gsm8k": {"avg@k": 0.25, "pass@k": 0.5, "n": 8},
    },
    "average": {"avg@k": 0.375, "pass@k": 0.625},
}


def dppo_extra() -> dict[int, dict]:
    extra = {}
    for i in range(5):
        extra[i] = {
            "tokens/generated": 50.0,
            "tokens/trained": 25.0,
            "tokens/pruned": 25.0,
            # only the kept prompts are rolled out (shrink): GRPO's 32 samples a step x the kept fraction
            "samples/generated": 32.0 * PROMPT_KEEP[i],
            "samples/trained": 32.0 * PROMPT_KEEP[i] * COMPLETION_KEEP[i],
            "samples/pruned": 32.0 * PROMPT_KEEP[i] * (1.0 - COMPLETION_KEEP[i]),
            "dppo/prompt_keep_frac": PROMPT_KEEP[i],
            "dppo/completion_keep_frac": COMPLETION_KEEP[i],
            "dppo/weight_mean": 1.0,
            "dppo/weight_max": 2.0 + i,
            "dppo/weight_ess": 0.8,
            "dppo/pack_density": 0.9,
            "dppo/pack_micro_batches": 3.0,
            "dppo/pack_lower_bound": 2.0,
            "dppo/pack_rank_imbalance": 1.0,
        }
    return extra


@pytest.fixture
def rundirs(rundirs) -> SimpleNamespace:
    """The shared builders, with the GRPO run's numbers above."""
    return SimpleNamespace(**vars(rundirs), GRPO_PHASES=GRPO_PHASES, GRPO_REWARD=GRPO_REWARD)


@pytest.fixture
def grpo_dir(tmp_path, rundirs) -> Path:
    rows = rundirs.train_rows(GRPO_PHASES, GRPO_REWARD)
    return rundirs.write_run(tmp_path / "grpo", rows, algo="grpo", eval_results=EVAL_RESULTS)


@pytest.fixture
def dppo_dir(tmp_path, rundirs) -> Path:
    args = json.loads(json.dumps(rundirs.BASE_ARGS))
    args["dppo"] = {"prompt_prune_rate": 0.5, "completion_prune_rate": 0.5}
    dppo = {"method": "dppo", "prompt_prune_rate": 0.5, "completion_prune_rate": 0.5}
    rows = rundirs.train_rows(DPPO_PHASES, DPPO_REWARD, dppo_extra())
    rows.insert(2, {"kind": "eval", "step": 2, "time": 0.0, "wall_time": 10.0, "eval_math500_pass1": 0.25})
    eval_results = {
        "model": "ckpt",
        "k": 4,
        "benchmarks": {"math500": {"avg@k": 0.625, "pass@k": 0.75, "n": 8}, "gsm8k": {"avg@k": 0.25, "n": 8}},
        "average": {"avg@k": 0.4375, "pass@k": 0.625},
    }
    return rundirs.write_run(
        tmp_path / "dppo", rows, algo="dppo", args=args, dppo=dppo, eval_results=eval_results
    )
